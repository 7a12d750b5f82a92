//! The DOCA RDMA transport (work in progress: not usable yet).

use std::sync::Arc;

use super::Transport;
use crate::error::{Error, Result};

/// The transport a `doca://` address names.
pub(crate) fn transport_for(addr: &str) -> Result<Arc<dyn Transport>> {
    Err(Error::InvalidAddress {
        addr: addr.to_owned(),
        reason: "the DOCA transport is not finished yet".into(),
    })
}
