//! The client side: `<Service>Client`, one async method per endpoint over
//! `rdma_rpc_core::Client` (two for receive and read endpoints with a payload, which
//! can also land their bytes in the caller's buffer, and three for bulk read streams, which
//! can also hand their chunks over as they arrive).

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::{
    doc_attrs, endpoint_doc, ident, message_type, shape, size_text, table_name, Shape, FRAME_RULE,
};
use crate::ir::{EndpointIr, OpKind, ServiceIr};

/// What a client method's arguments and result mean.
fn call_doc(ep: &EndpointIr) -> String {
    let max_len = size_text(ep.stream.max_len().unwrap_or(ep.buffer_size));
    match shape(ep) {
        Shape::Unary => unary_call_doc(ep.op, ep.payload, &size_text(ep.buffer_size)),
        Shape::Messages {
            requests,
            responses,
        } => {
            let mut text = match (requests, responses) {
                (true, true) => String::from(
                    "Sends the messages of `request` (any `Stream` of them, or a `Request` wrapping\n\
                     one to set a deadline or metadata) from a task of their own, and returns the\n\
                     server's stream of messages as they arrive: take them with\n\
                     `message().await` (or read it as a `Stream`) until `None`. Each side sends\n\
                     only while the other's window (`stream_window`) has room, so a side that\n\
                     reads slowly holds the other back. Dropping the stream cancels the call; an\n\
                     error from the server ends it after the messages before it.\n",
                ),
                (true, false) => String::from(
                    "Sends the messages of `request` (any `Stream` of them, or a `Request` wrapping\n\
                     one to set a deadline or metadata) and returns the server's response. They\n\
                     leave only while the server's window (`stream_window`) has room, so a\n\
                     handler that takes them slowly holds this call back. The server may answer\n\
                     before the stream ended: the rest is not sent.\n",
                ),
                _ => String::from(
                    "Sends the request message and returns the server's stream of response\n\
                     messages: take them with `message().await` (or read it as a `Stream`) until\n\
                     `None`. The server sends only while this client's window (`stream_window`)\n\
                     has room, so reading slowly holds it back. Dropping the stream cancels the\n\
                     call; an error from the server ends it after the messages before it.\n",
                ),
            };
            text.push_str(FRAME_RULE);
            text
        }
        Shape::BulkWrite => format!(
            "Moves `data`, at most {max_len}, to the server in chunks of at most the buffer size,\n\
             several in flight: this client offers read-only windows of its memory, and the\n\
             server pulls each chunk by RDMA read into one of the path's pooled buffers as its\n\
             handler takes them (a slow handler makes this call wait). Returns the response."
        ),
        Shape::BulkRead => format!(
            "Returns the response and every byte of the stream (at most {max_len}), collected\n\
             into one buffer as the chunks arrive: the server RDMA-writes each chunk, at most\n\
             the buffer size, into a window this client offers (`stream_depth` of them at a\n\
             time, each offered again once emptied). [`{m}_stream`](Self::{m}_stream) hands\n\
             them over one by one instead.",
            m = ep.method
        ),
    }
}

/// What a unary client method's arguments and result mean, by operation: the route the
/// runtime's client and server take (`rdma-rpc-core`'s `protocol/route.rs`).
fn unary_call_doc(op: OpKind, payload: bool, buffer: &str) -> String {
    match op {
        OpKind::Send | OpKind::Receive if !payload => {
            "Sends the request message alone, inside the request frame; returns the response \
             message, which comes back inside the response frame."
                .to_owned()
        }
        OpKind::Send | OpKind::Write => format!(
            "Moves `data` (at most {buffer}) to the server with the request: up to the\n\
             connection's inline threshold (8 KiB by default) inside the request frame. A\n\
             larger payload that fits one of the connection's write slots (64 KiB by default,\n\
             armed after its first large payload) this client RDMA-writes into a free one: one\n\
             round trip. Else, where the server pulls (`pull_writes`, the default over DOCA),\n\
             the server RDMA-reads it from a read-only window this client offers with the\n\
             request: one round trip; over the software transport by default, the server\n\
             grants a window for the call and this client RDMA-writes it there: two. Returns\n\
             the response once the handler returned."
        ),
        OpKind::Receive | OpKind::Read => format!(
            "Returns the response and the bytes the handler put in its buffer (at most\n\
             {buffer}): up to the connection's inline threshold (8 KiB by default) inside the\n\
             response frame; a larger result is RDMA-written by the server into a write-only\n\
             window this client offers with the request (sized by this endpoint's last\n\
             result) before it responds: one round trip. A result that finds no window that\n\
             fits costs a second, in which the server asks for one. No copy on the way out."
        ),
    }
}

pub(super) fn generate(ir: &ServiceIr) -> TokenStream {
    let name = ident(&ir.name);
    let client = format_ident!("{}Client", name);
    let table = table_name(ir);
    let doc = doc_attrs(&format!("Client of `{}`. Cheap to clone.", ir.name));
    let methods = ir.endpoints.iter().enumerate().map(|(index, ep)| {
        let index = Literal::usize_unsuffixed(index);
        let endpoint = quote!(&super::#table[#index]);
        match shape(ep) {
            Shape::Unary if !ep.payload => message_only(ep, &endpoint),
            Shape::Unary if ep.op.is_inbound() => inbound(ep, &endpoint),
            Shape::BulkWrite => inbound(ep, &endpoint),
            Shape::Unary | Shape::BulkRead => outbound(ep, &endpoint),
            Shape::Messages {
                requests,
                responses,
            } => messages(ep, &endpoint, requests, responses),
        }
    });
    quote! {
        #doc
        #[derive(Debug, Clone)]
        pub struct #client {
            inner: ::rdma_rpc_core::Client,
        }

        impl #client {
            /// Connects to `addr` (e.g. `tcp://127.0.0.1:7470`).
            pub async fn connect(
                addr: &str,
            ) -> ::core::result::Result<Self, ::rdma_rpc_core::Error> {
                ::core::result::Result::Ok(Self::new(
                    ::rdma_rpc_core::Client::connect(addr).await?,
                ))
            }

            /// Uses an existing connection.
            pub fn new(inner: ::rdma_rpc_core::Client) -> Self {
                Self { inner }
            }

            /// The underlying client.
            pub fn inner(&self) -> &::rdma_rpc_core::Client {
                &self.inner
            }

            #(#methods)*
        }
    }
}

/// `IntoRequest::into_request(request)`, spelled so that the trait need not be in scope.
fn into_request() -> TokenStream {
    quote!(::rdma_rpc_core::IntoRequest::into_request(request))
}

/// An endpoint without payload: the request goes alone, the result bytes (none) are dropped.
fn message_only(ep: &EndpointIr, endpoint: &TokenStream) -> TokenStream {
    let method = ident(&ep.method);
    let doc = endpoint_doc(ep, &call_doc(ep));
    let request = message_type(ep.request.as_ref());
    let response = message_type(ep.response.as_ref());
    let into_request = into_request();
    let body = if ep.op.is_inbound() {
        quote! {
            ::rdma_rpc_core::typed::client::call_inbound(
                &self.inner,
                #endpoint,
                #into_request,
                ::rdma_rpc_core::Bytes::new(),
            )
            .await
        }
    } else {
        quote! {
            let (response, _) = ::rdma_rpc_core::typed::client::call_outbound(
                &self.inner,
                #endpoint,
                #into_request,
            )
            .await?;
            ::core::result::Result::Ok(response)
        }
    };
    quote! {
        #doc
        pub async fn #method(
            &self,
            request: impl ::rdma_rpc_core::IntoRequest<#request>,
        ) -> ::core::result::Result<#response, ::rdma_rpc_core::Status> {
            #body
        }
    }
}

/// A send or write with a payload, a bulk write stream included: the bytes go with the call.
fn inbound(ep: &EndpointIr, endpoint: &TokenStream) -> TokenStream {
    let method = ident(&ep.method);
    let doc = endpoint_doc(ep, &call_doc(ep));
    let request = message_type(ep.request.as_ref());
    let response = message_type(ep.response.as_ref());
    let into_request = into_request();
    quote! {
        #doc
        pub async fn #method(
            &self,
            request: impl ::rdma_rpc_core::IntoRequest<#request>,
            data: impl ::core::convert::Into<::rdma_rpc_core::Bytes>,
        ) -> ::core::result::Result<#response, ::rdma_rpc_core::Status> {
            ::rdma_rpc_core::typed::client::call_inbound(
                &self.inner,
                #endpoint,
                #into_request,
                ::core::convert::Into::into(data),
            )
            .await
        }
    }
}

/// A receive or read with a payload, a bulk read stream included: the bytes whole, or into
/// the caller's buffer, or (bulk read streams) as they arrive.
fn outbound(ep: &EndpointIr, endpoint: &TokenStream) -> TokenStream {
    let method = ident(&ep.method);
    let doc = endpoint_doc(ep, &call_doc(ep));
    let request = message_type(ep.request.as_ref());
    let response = message_type(ep.response.as_ref());
    let into_request = into_request();
    let method_into = format_ident!("{}_into", ep.method);
    let doc_into = doc_attrs(&if shape(ep) == Shape::BulkRead {
        format!(
            "As [`{}`](Self::{}), but each chunk is copied into `dst` as it arrives, from \
             its start: memory registered once (a lease of a `MemoryRegion` or of a \
             `SharedRegion`), so no buffer of the stream's size is allocated. Returns the \
             response and `dst` holding the bytes; a stream larger than `dst` fails with \
             `OUT_OF_RANGE` and the call is cancelled.",
            ep.method, ep.method
        )
    } else {
        format!(
            "As [`{}`](Self::{}), but the bytes land in `dst`, memory registered once: a \
             lease of a `MemoryRegion` (over DOCA copied in from the connection's bounce \
             memory, which the server writes; the server never reaches `dst`) or of a \
             `SharedRegion` shared with the connection (written in place). Nothing is \
             registered per call. Returns the response and `dst` holding the bytes; a \
             result larger than `dst` fails with `OUT_OF_RANGE`.",
            ep.method, ep.method
        )
    });
    let stream = (shape(ep) == Shape::BulkRead).then(|| {
        let method_stream = format_ident!("{}_stream", ep.method);
        let doc_stream = doc_attrs(&format!(
            "As [`{}`](Self::{}), but returns the stream as it arrives: its chunks, each at \
             most the buffer size (`chunk().await`, or read it as a `Stream`, until `None`), \
             then its response (`response()`). Taking a chunk offers the server a fresh \
             window, so a caller that stops reading stops the server; dropping the download \
             cancels the call.",
            ep.method, ep.method
        ));
        quote! {
            #doc_stream
            pub async fn #method_stream(
                &self,
                request: impl ::rdma_rpc_core::IntoRequest<#request>,
            ) -> ::core::result::Result<
                ::rdma_rpc_core::Download<#response>,
                ::rdma_rpc_core::Status,
            > {
                ::rdma_rpc_core::typed::client::call_read_stream(&self.inner, #endpoint, #into_request)
                    .await
            }
        }
    });
    quote! {
        #doc
        pub async fn #method(
            &self,
            request: impl ::rdma_rpc_core::IntoRequest<#request>,
        ) -> ::core::result::Result<
            (#response, ::rdma_rpc_core::Bytes),
            ::rdma_rpc_core::Status,
        > {
            ::rdma_rpc_core::typed::client::call_outbound(&self.inner, #endpoint, #into_request)
                .await
        }

        #doc_into
        pub async fn #method_into<B: ::rdma_rpc_core::Buffer>(
            &self,
            request: impl ::rdma_rpc_core::IntoRequest<#request>,
            dst: B,
        ) -> ::core::result::Result<
            (#response, B),
            ::rdma_rpc_core::Status,
        > {
            ::rdma_rpc_core::typed::client::call_outbound_into(
                &self.inner,
                #endpoint,
                #into_request,
                dst,
            )
            .await
        }

        #stream
    }
}

/// A message-streaming endpoint: the request message or the client's stream goes out, the
/// response message or the server's stream comes back.
fn messages(
    ep: &EndpointIr,
    endpoint: &TokenStream,
    requests: bool,
    responses: bool,
) -> TokenStream {
    let method = ident(&ep.method);
    let doc = endpoint_doc(ep, &call_doc(ep));
    let request = message_type(ep.request.as_ref());
    let response = message_type(ep.response.as_ref());
    let (param, argument) = if requests {
        (
            quote!(impl ::rdma_rpc_core::IntoStreamingRequest<Message = #request>),
            quote!(::rdma_rpc_core::IntoStreamingRequest::into_streaming_request(request)),
        )
    } else {
        (
            quote!(impl ::rdma_rpc_core::IntoRequest<#request>),
            into_request(),
        )
    };
    let (output, call) = match (requests, responses) {
        (true, true) => (
            quote!(::rdma_rpc_core::Streaming<#response>),
            quote!(call_bidi_stream),
        ),
        (true, false) => (response, quote!(call_client_stream)),
        (false, _) => (
            quote!(::rdma_rpc_core::Streaming<#response>),
            quote!(call_server_stream),
        ),
    };
    quote! {
        #doc
        pub async fn #method(
            &self,
            request: #param,
        ) -> ::core::result::Result<#output, ::rdma_rpc_core::Status> {
            ::rdma_rpc_core::typed::client::#call(&self.inner, #endpoint, #argument).await
        }
    }
}
