//! Code from `spec!` and from the generator's golden files compiles without warnings in a
//! user's crate (each module denies `warnings` and `missing_docs`; the workspace lints and
//! clippy apply too), next to the runtime's own names, and its endpoint tables and servers
//! work. Built with the other tests; the specs that must fail to compile are
//! `rdma-rpc-macros/tests/ui` (trybuild).

// Public, as in a user's crate that exports a service: what it exports is not dead code.
pub mod golden;
pub mod nested;
pub mod remote_buffer;
pub mod shadowing;
pub mod streams;
