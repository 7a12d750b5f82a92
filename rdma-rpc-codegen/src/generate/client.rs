//! The client side: `<Service>Client`, one async method per endpoint over
//! `rdma_rpc_core::codegen::Client` (two for receive and read endpoints with a payload, which
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
        Shape::Unary => unary_call_doc(ep.op, ep.payload).to_owned(),
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
             several in flight: the server RDMA-reads each from this client's memory as its\n\
             handler takes them (a slow handler makes this call wait). Returns the response."
        ),
        Shape::BulkRead => format!(
            "Returns the response and every byte of the stream (at most {max_len}), collected\n\
             into one buffer as the chunks arrive; [`{m}_stream`](Self::{m}_stream) hands them\n\
             over one by one instead.",
            m = ep.method
        ),
    }
}

/// What a unary client method's arguments and result mean, by operation.
fn unary_call_doc(op: OpKind, payload: bool) -> &'static str {
    match op {
        OpKind::Send if !payload => "Sends the request message; returns the response.",
        OpKind::Receive if !payload => "Sends the request message; returns the response.",
        OpKind::Send => "Sends `data` to the server with the request; returns the response.",
        OpKind::Write => {
            "RDMA-writes `data` into the endpoint's server buffer (at most the buffer size); \
             returns the response."
        }
        OpKind::Receive => "Returns the response and the bytes the server sent.",
        OpKind::Read => {
            "Returns the response and the bytes RDMA-read from the endpoint's server buffer."
        }
    }
}

pub(super) fn generate(ir: &ServiceIr) -> TokenStream {
    let name = ident(&ir.name);
    let client = format_ident!("{}Client", name);
    let table = table_name(ir);
    let doc = doc_attrs(&format!("Client of `{}`. Cheap to clone.", ir.name));
    let methods = ir.endpoints.iter().enumerate().map(|(index, ep)| {
        let index = Literal::usize_unsuffixed(index);
        let endpoint = quote!(&#table[#index]);
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
            inner: ::rdma_rpc_core::codegen::Client,
        }

        impl #client {
            /// Connects to `addr` (e.g. `tcp://127.0.0.1:7470`).
            pub async fn connect(
                addr: &str,
            ) -> ::core::result::Result<Self, ::rdma_rpc_core::codegen::Error> {
                ::core::result::Result::Ok(Self::new(
                    ::rdma_rpc_core::codegen::Client::connect(addr).await?,
                ))
            }

            /// Uses an existing connection.
            pub fn new(inner: ::rdma_rpc_core::codegen::Client) -> Self {
                Self { inner }
            }

            /// The underlying client.
            pub fn inner(&self) -> &::rdma_rpc_core::codegen::Client {
                &self.inner
            }

            #(#methods)*
        }
    }
}

/// `IntoRequest::into_request(request)`, spelled so that the trait need not be in scope.
fn into_request() -> TokenStream {
    quote!(::rdma_rpc_core::codegen::IntoRequest::into_request(request))
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
            ::rdma_rpc_core::codegen::call_inbound(
                &self.inner,
                #endpoint,
                #into_request,
                ::rdma_rpc_core::codegen::Bytes::new(),
            )
            .await
        }
    } else {
        quote! {
            let (response, _) = ::rdma_rpc_core::codegen::call_outbound(
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
            request: impl ::rdma_rpc_core::codegen::IntoRequest<#request>,
        ) -> ::core::result::Result<#response, ::rdma_rpc_core::codegen::Status> {
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
            request: impl ::rdma_rpc_core::codegen::IntoRequest<#request>,
            data: impl ::core::convert::Into<::rdma_rpc_core::codegen::Bytes>,
        ) -> ::core::result::Result<#response, ::rdma_rpc_core::codegen::Status> {
            ::rdma_rpc_core::codegen::call_inbound(
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
                request: impl ::rdma_rpc_core::codegen::IntoRequest<#request>,
            ) -> ::core::result::Result<
                ::rdma_rpc_core::codegen::Download<#response>,
                ::rdma_rpc_core::codegen::Status,
            > {
                ::rdma_rpc_core::codegen::call_read_stream(&self.inner, #endpoint, #into_request)
                    .await
            }
        }
    });
    quote! {
        #doc
        pub async fn #method(
            &self,
            request: impl ::rdma_rpc_core::codegen::IntoRequest<#request>,
        ) -> ::core::result::Result<
            (#response, ::rdma_rpc_core::codegen::Bytes),
            ::rdma_rpc_core::codegen::Status,
        > {
            ::rdma_rpc_core::codegen::call_outbound(&self.inner, #endpoint, #into_request)
                .await
        }

        #doc_into
        pub async fn #method_into<B: ::rdma_rpc_core::codegen::Buffer>(
            &self,
            request: impl ::rdma_rpc_core::codegen::IntoRequest<#request>,
            dst: B,
        ) -> ::core::result::Result<
            (#response, B),
            ::rdma_rpc_core::codegen::Status,
        > {
            ::rdma_rpc_core::codegen::call_outbound_into(
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
            quote!(impl ::rdma_rpc_core::codegen::IntoStreamingRequest<Message = #request>),
            quote!(::rdma_rpc_core::codegen::IntoStreamingRequest::into_streaming_request(request)),
        )
    } else {
        (
            quote!(impl ::rdma_rpc_core::codegen::IntoRequest<#request>),
            into_request(),
        )
    };
    let (output, call) = match (requests, responses) {
        (true, true) => (
            quote!(::rdma_rpc_core::codegen::Streaming<#response>),
            quote!(call_bidi_stream),
        ),
        (true, false) => (response, quote!(call_client_stream)),
        (false, _) => (
            quote!(::rdma_rpc_core::codegen::Streaming<#response>),
            quote!(call_server_stream),
        ),
    };
    quote! {
        #doc
        pub async fn #method(
            &self,
            request: #param,
        ) -> ::core::result::Result<#output, ::rdma_rpc_core::codegen::Status> {
            ::rdma_rpc_core::codegen::#call(&self.inner, #endpoint, #argument).await
        }
    }
}
