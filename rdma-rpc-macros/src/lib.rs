//! Procedural macros of rdma-rpc. Use them through `rdma-rpc-core`, which re-exports them
//! (`rdma_rpc_core::spec!`); generated code needs `rdma-rpc-core` and nothing else.
//!
//! # `spec!`
//!
//! Generates, in place, the items `rdma-rpc-codegen` would write from a build script: the
//! messages and enums, the endpoint table, the module `<service>_server` with the service
//! trait and its `<Service>Server<T>` adapter, the module `<service>_client` with the
//! `<Service>Client`, and a `pub use` of the trait, server and client.
//!
//! ```ignore
//! mod kv {
//!     rdma_rpc_core::spec!("specs/kv_store.yaml");
//! }
//! // Client only:
//! rdma_rpc_core::spec!("specs/kv_store.yaml", server = false);
//! ```
//!
//! The path is relative to the invoking crate's `CARGO_MANIFEST_DIR`. The expansion includes
//! the spec with `include_str!`, so Cargo rebuilds the crate when the spec changes. Options,
//! after the path: `server = bool`, `client = bool` (both `true` by default).
//!
//! Errors are compile errors: each problem in the spec becomes one `compile_error!` whose
//! message starts with `file:line:column` (a span can only point at the macro's string
//! literal, so the position in the spec is in the text), followed by the spec key and a hint.
//! Beside them the macro still generates the spec's sound parts (its messages, enums, and the
//! endpoints without a problem of their own), as thiserror does on error: code that uses the
//! service then fails once, at the spec's problems, not again at every use of a missing item.
//!
//! Pipeline: `parse` the arguments → `validate` (read and check the spec) → `expand`.

use proc_macro::TokenStream;

mod expand;
mod parse;
mod validate;

/// Generates the server, client, messages and endpoint table of a spec file; see the crate
/// documentation.
#[proc_macro]
pub fn spec(input: TokenStream) -> TokenStream {
    let args = match syn::parse::<parse::SpecArgs>(input) {
        Ok(args) => args,
        Err(err) => return err.to_compile_error().into(),
    };
    match validate::load(&args) {
        Ok(spec) => expand::expand(&spec, &args.options).into(),
        Err(invalid) => expand::fallback(invalid, &args.options).into(),
    }
}
