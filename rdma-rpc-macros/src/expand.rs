//! The expansion: the generated items, and an `include_str!` of the spec so that Cargo
//! rebuilds the crate when the spec changes.

use proc_macro2::TokenStream;
use quote::quote;
use rdma_rpc_codegen::Options;

use crate::validate::{Invalid, Spec};

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

/// The expansion of an invalid spec: its errors, then the items of its sound parts. A
/// generator that fails on those parts (it is written for valid specs) only costs the items.
pub(crate) fn fallback(invalid: Invalid, options: &Options) -> TokenStream {
    let errors = invalid.errors.to_compile_error();
    let items = invalid.partial.and_then(|spec| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| expand(&spec, options))).ok()
    });
    quote! {
        #errors
        #items
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::SpecArgs;

    fn expand_spec(path: &str) -> String {
        let args: SpecArgs = syn::parse_str(&format!("{path:?}")).unwrap();
        match crate::validate::load(&args) {
            Ok(spec) => expand(&spec, &args.options).to_string(),
            Err(invalid) => fallback(invalid, &args.options).to_string(),
        }
    }

    /// Current rustc silences the errors that follow a failed macro (unresolved names), so the
    /// UI tests cannot tell the fallback's items from their absence: this test looks at the
    /// expansion itself.
    #[test]
    fn an_invalid_spec_expands_to_its_errors_and_its_sound_items() {
        let out = expand_spec("tests/ui/specs/two_mistakes.yaml");
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
        for item in [
            "pub struct HelloRequest",
            "pub struct HelloReply",
            "pub trait Greeter",
            "pub struct GreeterServer",
            "pub struct GreeterClient",
            "fn say_hello",
            "fn upload_photo",
        ] {
            assert!(out.contains(item), "{item} missing from the fallback");
        }
    }

    /// An endpoint whose method name is broken stays out: generated, it would not compile.
    #[test]
    fn endpoints_with_a_broken_method_name_are_left_out() {
        let out = expand_spec("tests/ui/specs/invalid.yaml");
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
        assert!(!out.contains("fn connect_send") && out.matches("fn connect").count() == 1);
    }

    #[test]
    fn unreadable_specs_expand_to_the_error_alone() {
        let out = expand_spec("tests/ui/specs/missing.yaml");
        assert_eq!(out.matches("compile_error").count(), 1, "{out}");
        assert!(!out.contains("pub struct"), "{out}");
    }
}
