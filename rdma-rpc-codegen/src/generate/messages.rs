//! Messages and enums as prost structs and enumerations.
//!
//! Field types follow prost: scalars as their Rust type, `string` as `String`, `bytes` as
//! `Vec<u8>`, `optional` as `Option<T>`, `repeated` as `Vec<T>` (packed for numeric types,
//! prost's default), message fields as `Option<Message>` (boxed when the message can reach
//! itself through singular fields), enum fields as `i32` with `enumeration = "Enum"`.

use std::collections::HashSet;

use proc_macro2::TokenStream;
use quote::quote;

use super::{doc_attrs, ident, scalar_type};
use crate::ir::{EnumIr, FieldIr, FieldLabel, MessageIr, ScalarType, ServiceIr, TypeRef};

/// Every message, then every enum, in spec order.
pub(super) fn generate(ir: &ServiceIr) -> TokenStream {
    let messages = ir.messages.iter().map(|m| message(ir, m));
    let enums = ir.enums.iter().map(|e| enumeration(ir, e));
    quote! {
        #(#messages)*
        #(#enums)*
    }
}

fn message(ir: &ServiceIr, msg: &MessageIr) -> TokenStream {
    let name = ident(&msg.name);
    let doc = doc_attrs(
        msg.doc
            .as_deref()
            .unwrap_or(&format!("The `{}` message of `{}`.", msg.name, ir.name)),
    );
    let fields = msg.fields.iter().map(|f| field(ir, msg, f));
    quote! {
        #doc
        #[derive(Clone, PartialEq, ::rdma_rpc_core::prost::Message)]
        #[prost(prost_path = "::rdma_rpc_core::prost")]
        pub struct #name {
            #(#fields)*
        }
    }
}

fn field(ir: &ServiceIr, msg: &MessageIr, f: &FieldIr) -> TokenStream {
    let name = ident(&f.name);
    let tag = f.tag.to_string();
    let label = match f.label {
        FieldLabel::Singular => None,
        FieldLabel::Optional => Some(quote!(optional)),
        FieldLabel::Repeated => Some(quote!(repeated)),
    };
    let (attr, base) = match &f.ty {
        TypeRef::Scalar(ScalarType::Bytes) => {
            (quote!(bytes = "vec"), scalar_type(ScalarType::Bytes))
        }
        TypeRef::Scalar(s) => {
            let kind = ident(s.as_str());
            (quote!(#kind), scalar_type(*s))
        }
        TypeRef::Enum(e) => (quote!(enumeration = #e), quote!(i32)),
        TypeRef::Message(m) => {
            let ty = ident(m);
            (quote!(message), quote!(#ty))
        }
        TypeRef::RemoteBuffer => (quote!(message), quote!(::rdma_rpc_core::RemoteBuf)),
    };
    let (attr, ty) = match (&f.ty, f.label) {
        (TypeRef::RemoteBuffer, FieldLabel::Singular | FieldLabel::Optional) => (
            quote!(#attr, optional),
            quote!(::core::option::Option<#base>),
        ),
        (TypeRef::Message(m), FieldLabel::Singular | FieldLabel::Optional) => {
            if reaches(ir, m, &msg.name) {
                (
                    quote!(#attr, optional, boxed),
                    quote!(::core::option::Option<::std::boxed::Box<#base>>),
                )
            } else {
                (
                    quote!(#attr, optional),
                    quote!(::core::option::Option<#base>),
                )
            }
        }
        (_, FieldLabel::Singular) => (attr, base),
        (_, FieldLabel::Optional) => (quote!(#attr, #label), quote!(::core::option::Option<#base>)),
        (_, FieldLabel::Repeated) => (quote!(#attr, #label), quote!(::std::vec::Vec<#base>)),
    };
    let doc = doc_attrs(&field_doc(f));
    quote! {
        #doc
        #[prost(#attr, tag = #tag)]
        pub #name: #ty,
    }
}

fn field_doc(f: &FieldIr) -> String {
    let mut text = match &f.doc {
        Some(doc) => doc.trim_end().to_owned(),
        None => format!("Field `{}`, number {}.", f.name, f.tag),
    };
    if f.ty == TypeRef::RemoteBuffer {
        text.push_str(
            "\n\nA remote buffer: memory the sender offers for one-sided access. The receiver\n\
             uses it with the `RemoteMemory` of the connection it arrived on (in a handler,\n\
             `request.remote_memory()`); the sender makes it with `RemoteMemory::offer`.",
        );
    }
    if let TypeRef::Enum(e) = &f.ty {
        let accessors = match f.label {
            FieldLabel::Repeated => format!(
                "iterate them with `{0}()`, add one with `push_{0}()`",
                f.name
            ),
            _ => format!("read it with `{0}()`, set it with `set_{0}()`", f.name),
        };
        text.push_str(&format!("\n\nHolds [`{e}`] numbers; {accessors}."));
    }
    text
}

/// Whether message `from` contains message `to` through singular or optional message fields
/// (so `to` containing `from` by value would make an infinitely large type).
fn reaches(ir: &ServiceIr, from: &str, to: &str) -> bool {
    let mut seen = HashSet::new();
    let mut stack = vec![from];
    while let Some(name) = stack.pop() {
        if name == to {
            return true;
        }
        if !seen.insert(name) {
            continue;
        }
        let Some(msg) = ir.message(name) else {
            continue;
        };
        for f in &msg.fields {
            if let (TypeRef::Message(next), FieldLabel::Singular | FieldLabel::Optional) =
                (&f.ty, f.label)
            {
                stack.push(next);
            }
        }
    }
    false
}

fn enumeration(ir: &ServiceIr, e: &EnumIr) -> TokenStream {
    let name = ident(&e.name);
    let doc = doc_attrs(
        e.doc
            .as_deref()
            .unwrap_or(&format!("The `{}` enum of `{}`.", e.name, ir.name)),
    );
    let variants = e.values.iter().map(|v| {
        let variant = ident(&v.name);
        let number = proc_macro2::Literal::i32_unsuffixed(v.number);
        let n = v.number;
        let doc = doc_attrs(&match &v.doc {
            Some(doc) => format!("{}\n\n`{}` = {n}.", doc.trim_end(), v.spec_name),
            None => format!("`{}` = {n}.", v.spec_name),
        });
        quote! {
            #doc
            #variant = #number,
        }
    });
    let as_str = e.values.iter().map(|v| {
        let variant = ident(&v.name);
        let spec_name = &v.spec_name;
        quote!(Self::#variant => #spec_name,)
    });
    let from_str = e.values.iter().map(|v| {
        let variant = ident(&v.name);
        let spec_name = &v.spec_name;
        quote!(#spec_name => ::core::option::Option::Some(Self::#variant),)
    });
    quote! {
        #doc
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
            ::rdma_rpc_core::prost::Enumeration
        )]
        #[prost(prost_path = "::rdma_rpc_core::prost")]
        #[repr(i32)]
        pub enum #name {
            #(#variants)*
        }

        impl #name {
            /// The value's name as written in the spec.
            pub fn as_str_name(&self) -> &'static str {
                match self {
                    #(#as_str)*
                }
            }

            /// The value with this spec name, if there is one.
            pub fn from_str_name(value: &str) -> ::core::option::Option<Self> {
                match value {
                    #(#from_str)*
                    _ => ::core::option::Option::None,
                }
            }
        }
    }
}
