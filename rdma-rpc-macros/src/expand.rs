//! The expansion: the generated items, and an `include_str!` of the spec so that Cargo
//! rebuilds the crate when the spec changes.

use proc_macro2::TokenStream;
use quote::quote;
use rdma_rpc_codegen::Options;

use crate::validate::Spec;

pub(crate) fn expand(spec: &Spec, options: &Options) -> TokenStream {
    let items = rdma_rpc_codegen::generate_tokens(&spec.ir, options);
    // A path that is not UTF-8 cannot be written as a literal; the code is still generated,
    // only the rebuild-on-change hint is lost.
    let track = spec.file.to_str().map(|file| {
        quote! {
            const _: &str = ::core::include_str!(#file);
        }
    });
    quote! {
        #items
        #track
    }
}
