//! The client side: `<Service>Client`, one async method per endpoint over
//! `rdma_rpc_core::codegen::Client`.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::server::is_inbound;
use super::{doc_attrs, endpoint_doc, ident, message_type, table_name};
use crate::ir::{OpKind, ServiceIr};

/// What a client method's arguments and result mean, by operation.
fn call_doc(op: OpKind, payload: bool) -> &'static str {
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
        let method = ident(&ep.method);
        let doc = endpoint_doc(ep, call_doc(ep.op, ep.payload));
        let request = message_type(ep.request.as_ref());
        let response = message_type(ep.response.as_ref());
        let index = Literal::usize_unsuffixed(index);
        let into_request = quote! {
            ::rdma_rpc_core::codegen::IntoRequest::into_request(request)
        };
        if !ep.payload {
            // Messages only: the request goes alone, the result bytes (none) are dropped.
            let body = if is_inbound(ep.op) {
                quote! {
                    ::rdma_rpc_core::codegen::call_inbound(
                        &self.inner,
                        &#table[#index],
                        #into_request,
                        ::rdma_rpc_core::codegen::Bytes::new(),
                    )
                    .await
                }
            } else {
                quote! {
                    let (response, _) = ::rdma_rpc_core::codegen::call_outbound(
                        &self.inner,
                        &#table[#index],
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
        } else if is_inbound(ep.op) {
            quote! {
                #doc
                pub async fn #method(
                    &self,
                    request: impl ::rdma_rpc_core::codegen::IntoRequest<#request>,
                    data: impl ::core::convert::Into<::rdma_rpc_core::codegen::Bytes>,
                ) -> ::core::result::Result<#response, ::rdma_rpc_core::codegen::Status> {
                    ::rdma_rpc_core::codegen::call_inbound(
                        &self.inner,
                        &#table[#index],
                        #into_request,
                        ::core::convert::Into::into(data),
                    )
                    .await
                }
            }
        } else {
            let method_into = format_ident!("{}_into", ep.method);
            let doc_into = doc_attrs(&format!(
                "As [`{}`](Self::{}), but the bytes land in `dst`, memory registered once: a \
                 lease of a `MemoryRegion` (over DOCA copied in from the connection's bounce \
                 memory, which the server writes; the server never reaches `dst`) or of a \
                 `SharedRegion` shared with the connection (written in place). Nothing is \
                 registered per call. Returns the response and `dst` holding the bytes; a \
                 result larger than `dst` fails with `OUT_OF_RANGE`.",
                ep.method, ep.method
            ));
            quote! {
                #doc
                pub async fn #method(
                    &self,
                    request: impl ::rdma_rpc_core::codegen::IntoRequest<#request>,
                ) -> ::core::result::Result<
                    (#response, ::rdma_rpc_core::codegen::Bytes),
                    ::rdma_rpc_core::codegen::Status,
                > {
                    ::rdma_rpc_core::codegen::call_outbound(&self.inner, &#table[#index], #into_request)
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
                        &#table[#index],
                        #into_request,
                        dst,
                    )
                    .await
                }
            }
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
