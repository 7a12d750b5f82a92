//! The server side: the service trait users implement and the `<Service>Server<T>` adapter
//! that implements `rdma_rpc_core::Service` for any implementation of it.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::{
    doc_attrs, endpoint_doc, ident, message_type, shape, size_text, table_name, Shape, FRAME_RULE,
};
use crate::ir::{EndpointIr, OpKind, ServiceIr};
use crate::naming;

pub(super) fn generate(ir: &ServiceIr) -> TokenStream {
    let service_trait = service_trait(ir);
    let adapter = adapter(ir);
    quote! {
        #service_trait
        #adapter
    }
}

/// What a handler's arguments and result mean.
fn handler_doc(ep: &EndpointIr) -> String {
    let max_len = size_text(ep.stream.max_len().unwrap_or(ep.buffer_size));
    match shape(ep) {
        Shape::Unary => unary_handler_doc(ep.op, ep.payload, &size_text(ep.buffer_size)),
        Shape::Messages {
            requests,
            responses,
        } => {
            let mut text = String::new();
            if requests {
                text.push_str(
                    "`request` holds the client's stream of messages: take them with\n\
                     `request.get_mut().message().await` (or read it as a `Stream`) until it\n\
                     ends with `None`. The client sends only while this side's window\n\
                     (`stream_window`) has room, so a handler that takes them slowly holds the\n\
                     client back.\n",
                );
            }
            if responses {
                text.push_str(
                    "Return the stream of response messages: the server sends each one as the\n\
                     stream yields it, packed into frames, and only while the client's window\n\
                     has room, so a client that reads slowly holds the stream back. An `Err`\n\
                     item ends the call with that status, after the messages before it.\n",
                );
            } else {
                text.push_str("The response message is the whole answer.\n");
            }
            text.push_str(FRAME_RULE);
            text
        }
        Shape::BulkWrite => format!(
            "`chunks` brings the payload as the handler takes it: `chunks.chunk().await` (or\n\
             read it as a `Stream`) until `None`; `chunks.len()` is the total the client\n\
             declared, at most {max_len}. Each chunk is at most the buffer size, read from the\n\
             client's memory by RDMA a few ahead, and a lease of one of the path's pooled\n\
             buffers: dropping it frees the buffer for the next chunk, so copy what you keep.\n\
             A handler that takes chunks slowly makes the client wait."
        ),
        Shape::BulkRead => format!(
            "Send the result into `sink` in chunks of at most the buffer size\n\
             (`sink.chunk_size()`), at most {max_len} in all: fill a pooled buffer from\n\
             `sink.buffer().await?` and `sink.send(buf).await?` it, or copy with\n\
             `sink.send_bytes(&data).await?`. Each chunk is RDMA-written into a window the\n\
             client offered; `send` waits while the client has none free, so a client that\n\
             reads slowly holds the handler back. The response message follows the last\n\
             chunk."
        ),
    }
}

/// What a unary handler's arguments mean, by operation: the route the runtime took
/// (`rdma-rpc-core`'s `protocol/route.rs`).
fn unary_handler_doc(op: OpKind, payload: bool, buffer: &str) -> String {
    match op {
        OpKind::Send | OpKind::Receive if !payload => {
            "The request message is the whole call: no bytes come with it, and the response\n\
             message is the whole answer."
                .to_owned()
        }
        OpKind::Send | OpKind::Write => format!(
            "`data` holds the bytes the client sent (at most {buffer}): up to the connection's\n\
             inline threshold (8 KiB by default) they came inside the request frame; larger\n\
             ones are in registered memory, either one of this connection's write slots that\n\
             the client RDMA-wrote, or one of the path's pooled buffers that this server\n\
             RDMA-read from a window the client offered (pull mode) or that the client\n\
             RDMA-wrote through a window this server granted. Keeping `data` (or a slice of\n\
             it) after returning keeps that buffer from later calls, which fail with\n\
             `RESOURCE_EXHAUSTED` once every buffer of the path is kept; copy what you keep\n\
             (`data.to_vec()`)."
        ),
        OpKind::Receive | OpKind::Read => format!(
            "Fill `buf`, one of the path's pooled buffers (its capacity is {buffer}; set its\n\
             length with `fill_from` or `set_len`). Once the handler returned, its contents go\n\
             back inside the response frame up to the connection's inline threshold (8 KiB by\n\
             default); a larger result this server RDMA-writes into the window the client\n\
             offered with the request (asking for one first if none fits)."
        ),
    }
}

fn service_trait(ir: &ServiceIr) -> TokenStream {
    let name = ident(&ir.name);
    let server = format_ident!("{}Server", name);
    let doc = match &ir.doc {
        Some(doc) => format!(
            "{}\n\nImplement this trait (with `async fn`s) and serve it with [`{server}`].",
            doc.trim_end()
        ),
        None => format!(
            "The `{}` service: implement this trait (with `async fn`s) and serve it with \
             [`{server}`].",
            ir.name
        ),
    };
    let doc = doc_attrs(&doc);
    let methods = ir.endpoints.iter().map(|ep| {
        let method = ident(&ep.method);
        let doc = endpoint_doc(ep, &handler_doc(ep));
        let mut request = message_type(ep.request.as_ref());
        if ep.stream.streams_requests() {
            request = quote!(::rdma_rpc_core::Streaming<#request>);
        }
        let mut response = message_type(ep.response.as_ref());
        // A handler that streams its responses returns a stream of its own choosing, named by
        // an associated type (tonic-build's shape).
        let mut stream_type = quote!();
        if ep.stream.streams_responses() {
            let name = ident(&naming::stream_type_name(&ep.method));
            let doc = doc_attrs(&format!(
                "The stream of response messages that [`{}`](Self::{}) returns.",
                ep.method, ep.method
            ));
            stream_type = quote! {
                #doc
                type #name: ::rdma_rpc_core::Stream<
                    Item = ::core::result::Result<#response, ::rdma_rpc_core::Status>,
                > + ::core::marker::Send + 'static;
            };
            response = quote!(Self::#name);
        }
        let payload = payload_param(ep);
        quote! {
            #stream_type
            #doc
            fn #method(
                &self,
                request: ::rdma_rpc_core::Request<#request>,
                #payload
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<#response, ::rdma_rpc_core::Status>,
            > + ::core::marker::Send;
        }
    });
    quote! {
        #doc
        pub trait #name: ::core::marker::Send + ::core::marker::Sync + 'static {
            #(#methods)*
        }
    }
}

/// The handler's second parameter (with its comma): the bytes moved in, the buffer to fill,
/// the chunks of a bulk stream or where to send them, or none for an endpoint without payload.
fn payload_param(ep: &EndpointIr) -> TokenStream {
    match shape(ep) {
        Shape::BulkWrite => quote!(chunks: ::rdma_rpc_core::Chunks,),
        Shape::BulkRead => quote!(sink: &mut ::rdma_rpc_core::ChunkSink,),
        Shape::Messages { .. } => quote!(),
        Shape::Unary if !ep.payload => quote!(),
        Shape::Unary if ep.op.is_inbound() => quote!(data: ::rdma_rpc_core::Bytes,),
        Shape::Unary => quote!(buf: &mut ::rdma_rpc_core::RegisteredBuf,),
    }
}

fn adapter(ir: &ServiceIr) -> TokenStream {
    let name = ident(&ir.name);
    let server = format_ident!("{}Server", name);
    let table = table_name(ir);
    let service_name = &ir.name;
    let server_name = server.to_string();
    let doc = doc_attrs(&format!(
        "Serves a [`{name}`] implementation: pass it to `Server::builder().add_service(..)`.\n\
         Cloning it shares the implementation."
    ));
    let arms = ir.endpoints.iter().enumerate().map(|(index, ep)| {
        let index = Literal::usize_unsuffixed(index);
        match shape(ep) {
            Shape::Unary => unary_arm(index, ep),
            Shape::Messages {
                requests,
                responses,
            } => messages_arm(index, ep, requests, responses),
            Shape::BulkWrite => bulk_arm(
                index,
                ep,
                quote!(InboundStream { request, chunks }),
                quote!(chunks),
            ),
            Shape::BulkRead => bulk_arm(
                index,
                ep,
                quote!(OutboundStream { request, sink }),
                quote!(sink),
            ),
        }
    });
    quote! {
        #doc
        pub struct #server<T> {
            inner: ::std::sync::Arc<T>,
        }

        impl<T: #name> #server<T> {
            /// Wraps an implementation.
            pub fn new(inner: T) -> Self {
                Self { inner: ::std::sync::Arc::new(inner) }
            }

            /// Wraps a shared implementation.
            pub fn from_arc(inner: ::std::sync::Arc<T>) -> Self {
                Self { inner }
            }
        }

        impl<T> ::core::clone::Clone for #server<T> {
            fn clone(&self) -> Self {
                Self { inner: ::std::sync::Arc::clone(&self.inner) }
            }
        }

        impl<T> ::core::fmt::Debug for #server<T> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.debug_struct(#server_name).finish_non_exhaustive()
            }
        }

        impl<T: #name> ::rdma_rpc_core::Service for #server<T> {
            fn name(&self) -> &'static str {
                #service_name
            }

            fn endpoints(&self) -> &'static [::rdma_rpc_core::EndpointDef] {
                super::#table
            }

            fn call<'a>(
                &'a self,
                index: usize,
                call: ::rdma_rpc_core::ServerCall<'a>,
            ) -> ::rdma_rpc_core::transport::BoxFuture<
                'a,
                ::core::result::Result<
                    ::rdma_rpc_core::Bytes,
                    ::rdma_rpc_core::Status,
                >,
            > {
                match (index, call) {
                    #(#arms)*
                    (index, call) => {
                        ::rdma_rpc_core::typed::server::mismatched_call(#service_name, index, call)
                    }
                }
            }
        }
    }
}

/// The arm of a unary endpoint: decode the request, run the handler with the bytes or the
/// buffer (or neither, without payload), encode the response.
fn unary_arm(index: Literal, ep: &EndpointIr) -> TokenStream {
    let request = message_type(ep.request.as_ref());
    let (pattern, args, refuse) = match (ep.op.is_inbound(), ep.payload) {
        (true, true) => (
            quote!(Inbound { request, data }),
            quote!(request, data),
            quote!(),
        ),
        (false, true) => (
            quote!(Outbound { request, buf }),
            quote!(request, buf),
            quote!(),
        ),
        // A client that sends bytes anyway (not a generated one) is told, and the
        // handler does not run.
        (true, false) => {
            let refusal = format!(
                "{} {} carries no payload: send the request message alone",
                ep.op, ep.path
            );
            (
                quote!(Inbound { request, data }),
                quote!(request),
                quote! {
                    if !data.is_empty() {
                        return ::core::result::Result::Err(
                            ::rdma_rpc_core::Status::invalid_argument(#refusal),
                        );
                    }
                },
            )
        }
        (false, false) => (quote!(Outbound { request, .. }), quote!(request), quote!()),
    };
    let respond = respond(ep, args);
    quote! {
        (#index, ::rdma_rpc_core::ServerCall::#pattern) => {
            ::std::boxed::Box::pin(async move {
                #refuse
                let request = ::rdma_rpc_core::typed::server::decode_request::<#request>(request)?;
                #respond
            })
        }
    }
}

/// Runs the handler with `args` and encodes the response message it returns.
fn respond(ep: &EndpointIr, args: TokenStream) -> TokenStream {
    let method = ident(&ep.method);
    // Without a response message the handler returns `()`; binding that to a variable
    // would trip clippy's `let_unit_value` in crates that `include!` this code.
    if ep.response.is_some() {
        quote! {
            let response = self.inner.#method(#args).await?;
            ::core::result::Result::Ok(::rdma_rpc_core::typed::server::encode_message(&response))
        }
    } else {
        quote! {
            self.inner.#method(#args).await?;
            ::core::result::Result::Ok(::rdma_rpc_core::typed::server::encode_message(&()))
        }
    }
}

/// The arm of a message-streaming endpoint: the client's messages typed into the request (or
/// its request message decoded), then the handler's stream of messages sent (or its response
/// message encoded).
fn messages_arm(index: Literal, ep: &EndpointIr, requests: bool, responses: bool) -> TokenStream {
    let method = ident(&ep.method);
    let request_type = message_type(ep.request.as_ref());
    let some = quote!(::core::option::Option::Some);
    let streams = match (requests, responses) {
        (true, true) => quote!(requests: #some(requests), responses: #some(sink)),
        (true, false) => quote!(requests: #some(requests), ..),
        (false, _) => quote!(responses: #some(sink), ..),
    };
    let request = if requests {
        quote! {
            let request =
                ::rdma_rpc_core::typed::server::streaming_request::<#request_type>(request, requests);
        }
    } else {
        quote! {
            let request = ::rdma_rpc_core::typed::server::decode_request::<#request_type>(request)?;
        }
    };
    let answer = if responses {
        quote! {
            let stream = self.inner.#method(request).await?;
            ::rdma_rpc_core::typed::server::send_responses(sink, stream).await
        }
    } else {
        respond(ep, quote!(request))
    };
    quote! {
        (#index, ::rdma_rpc_core::ServerCall::Streaming { request, #streams }) => {
            ::std::boxed::Box::pin(async move {
                #request
                #answer
            })
        }
    }
}

/// The arm of a bulk stream: decode the request, run the handler with the chunks or the sink
/// (`pattern` binds `request` and `arg`), encode the response.
fn bulk_arm(
    index: Literal,
    ep: &EndpointIr,
    pattern: TokenStream,
    arg: TokenStream,
) -> TokenStream {
    let request = message_type(ep.request.as_ref());
    let respond = respond(ep, quote!(request, #arg));
    quote! {
        (#index, ::rdma_rpc_core::ServerCall::#pattern) => {
            ::std::boxed::Box::pin(async move {
                let request = ::rdma_rpc_core::typed::server::decode_request::<#request>(request)?;
                #respond
            })
        }
    }
}
