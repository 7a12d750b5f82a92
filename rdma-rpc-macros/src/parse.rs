//! The macro's arguments: `"path/to/spec.yaml"` then optional `server = bool`,
//! `client = bool`.

use rdma_rpc_codegen::Options;
use syn::parse::{Parse, ParseStream};
use syn::{Ident, LitBool, LitStr, Token};

/// The parsed arguments of `spec!`.
pub(crate) struct SpecArgs {
    /// The spec path, relative to `CARGO_MANIFEST_DIR`; errors about the spec point here.
    pub(crate) path: LitStr,
    /// What to generate.
    pub(crate) options: Options,
}

const USAGE: &str =
    "expected the spec file path as a string literal, e.g. `spec!(\"specs/kv_store.yaml\")`";

impl Parse for SpecArgs {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.is_empty() {
            return Err(syn::Error::new(proc_macro2::Span::call_site(), USAGE));
        }
        let path = input
            .parse::<LitStr>()
            .map_err(|err| syn::Error::new(err.span(), USAGE))?;
        let mut options = Options::default();
        let mut errors: Option<syn::Error> = None;
        let mut push = |err: syn::Error| match &mut errors {
            Some(all) => all.combine(err),
            None => errors = Some(err),
        };
        let mut seen: Vec<String> = Vec::new();
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let key: Ident = input.parse().map_err(|err| {
                syn::Error::new(
                    err.span(),
                    "expected an option: `server = true|false` or `client = true|false`",
                )
            })?;
            input.parse::<Token![=]>()?;
            let value: LitBool = input.parse()?;
            let name = key.to_string();
            if seen.contains(&name) {
                push(syn::Error::new(
                    key.span(),
                    format!("`{name}` is given twice"),
                ));
                continue;
            }
            match name.as_str() {
                "server" => options.build_server = value.value,
                "client" => options.build_client = value.value,
                _ => {
                    push(syn::Error::new(
                        key.span(),
                        format!("unknown option `{name}`; the options are `server` and `client`"),
                    ));
                    continue;
                }
            }
            seen.push(name);
        }
        match errors {
            Some(err) => Err(err),
            None => Ok(SpecArgs { path, options }),
        }
    }
}
