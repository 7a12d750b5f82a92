#![doc = include_str!("../README.md")]

pub mod error;
pub mod memory;
pub mod transport;

pub use error::{Error, Result};
