//! Raw DOCA bindings (work in progress).
