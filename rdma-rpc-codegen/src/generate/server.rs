//! The server side: the service trait users implement and the `<Service>Server<T>` adapter
//! that implements `rdma_rpc_core::codegen::Service` for any implementation of it.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::{doc_attrs, endpoint_doc, ident, message_type, table_name};
use crate::ir::{EndpointIr, OpKind, ServiceIr};

pub(super) fn generate(ir: &ServiceIr) -> TokenStream {
    let service_trait = service_trait(ir);
    let adapter = adapter(ir);
    quote! {
        #service_trait
        #adapter
    }
}

/// What a handler's arguments mean, by operation.
fn handler_doc(op: OpKind, payload: bool) -> &'static str {
    match op {
        OpKind::Send | OpKind::Receive if !payload => {
            "The request message is the whole call: no bytes come with it, and the response\n\
             message is the whole answer."
        }
        OpKind::Send => {
            "`data` holds the bytes the client sent. It may be a lease of one of the path's\n\
             pooled buffers: keeping it (or a slice of it) after returning keeps that buffer\n\
             from the path's later calls; copy what you keep (`data.to_vec()`)."
        }
        OpKind::Write => {
            "`data` holds the bytes the client wrote into the endpoint's buffer: a lease of\n\
             one of the path's pooled buffers. Keeping it (or a slice of it) after returning\n\
             keeps that buffer from the path's later calls, which fail with\n\
             `RESOURCE_EXHAUSTED` once every buffer is kept; copy what you keep\n\
             (`data.to_vec()`)."
        }
        OpKind::Receive => {
            "Fill `buf` (its capacity is the buffer size; set its length with `fill_from` or \
             `set_len`): the client receives its contents with the response."
        }
        OpKind::Read => {
            "Fill `buf` (its capacity is the buffer size; set its length with `fill_from` or \
             `set_len`): the client reads its contents once the handler returned."
        }
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
        let doc = endpoint_doc(ep, handler_doc(ep.op, ep.payload));
        let request = message_type(ep.request.as_ref());
        let response = message_type(ep.response.as_ref());
        let payload = payload_param(ep);
        quote! {
            #doc
            fn #method(
                &self,
                request: ::rdma_rpc_core::codegen::Request<#request>,
                #payload
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<#response, ::rdma_rpc_core::codegen::Status>,
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
/// or none for an endpoint without payload.
fn payload_param(ep: &EndpointIr) -> TokenStream {
    if !ep.payload {
        quote!()
    } else if is_inbound(ep.op) {
        quote!(data: ::rdma_rpc_core::codegen::Bytes,)
    } else {
        quote!(buf: &mut ::rdma_rpc_core::codegen::RegisteredBuf,)
    }
}

/// Send and write move bytes from the client to the server; receive and read the other way.
pub(super) fn is_inbound(op: OpKind) -> bool {
    matches!(op, OpKind::Send | OpKind::Write)
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
        let method = ident(&ep.method);
        let request = message_type(ep.request.as_ref());
        let (pattern, payload, refuse) = match (is_inbound(ep.op), ep.payload) {
            (true, true) => (quote!(Inbound { request, data }), quote!(, data), quote!()),
            (false, true) => (quote!(Outbound { request, buf }), quote!(, buf), quote!()),
            // A client that sends bytes anyway (not a generated one) is told, and the
            // handler does not run.
            (true, false) => {
                let refusal = format!(
                    "{} {} carries no payload: send the request message alone",
                    ep.op, ep.path
                );
                (
                    quote!(Inbound { request, data }),
                    quote!(),
                    quote! {
                        if !data.is_empty() {
                            return ::core::result::Result::Err(
                                ::rdma_rpc_core::codegen::Status::invalid_argument(#refusal),
                            );
                        }
                    },
                )
            }
            (false, false) => (quote!(Outbound { request, .. }), quote!(), quote!()),
        };
        // Without a response message the handler returns `()`; binding that to a variable
        // would trip clippy's `let_unit_value` in crates that `include!` this code.
        let respond = if ep.response.is_some() {
            quote! {
                let response = self.inner.#method(request #payload).await?;
                ::core::result::Result::Ok(::rdma_rpc_core::codegen::encode_message(&response))
            }
        } else {
            quote! {
                self.inner.#method(request #payload).await?;
                ::core::result::Result::Ok(::rdma_rpc_core::codegen::encode_message(&()))
            }
        };
        quote! {
            (#index, ::rdma_rpc_core::codegen::ServerCall::#pattern) => {
                ::std::boxed::Box::pin(async move {
                    #refuse
                    let request = ::rdma_rpc_core::codegen::decode_request::<#request>(request)?;
                    #respond
                })
            }
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

        impl<T: #name> ::rdma_rpc_core::codegen::Service for #server<T> {
            fn name(&self) -> &'static str {
                #service_name
            }

            fn endpoints(&self) -> &'static [::rdma_rpc_core::codegen::EndpointDef] {
                #table
            }

            fn call<'a>(
                &'a self,
                index: usize,
                call: ::rdma_rpc_core::codegen::ServerCall<'a>,
            ) -> ::rdma_rpc_core::codegen::BoxFuture<
                'a,
                ::core::result::Result<
                    ::rdma_rpc_core::codegen::Bytes,
                    ::rdma_rpc_core::codegen::Status,
                >,
            > {
                match (index, call) {
                    #(#arms)*
                    (index, call) => {
                        ::rdma_rpc_core::codegen::mismatched_call(#service_name, index, call)
                    }
                }
            }
        }
    }
}
