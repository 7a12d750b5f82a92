//! Error names and descriptions.

use crate::ffi::doca_error_t;
use std::ffi::{c_char, CStr};

/// (name, description) by error code.
const ERRORS: [(&CStr, &CStr); 31] = [
    (c"DOCA_SUCCESS", c"Success"),
    (c"DOCA_ERROR_UNKNOWN", c"Unknown error"),
    (c"DOCA_ERROR_NOT_PERMITTED", c"Operation not permitted"),
    (c"DOCA_ERROR_IN_USE", c"Resource already in use"),
    (c"DOCA_ERROR_NOT_SUPPORTED", c"Operation not supported"),
    (
        c"DOCA_ERROR_AGAIN",
        c"Resource temporarily unavailable, try again",
    ),
    (c"DOCA_ERROR_INVALID_VALUE", c"Invalid input"),
    (c"DOCA_ERROR_NO_MEMORY", c"Memory allocation failure"),
    (
        c"DOCA_ERROR_INITIALIZATION",
        c"Resource initialization failure",
    ),
    (
        c"DOCA_ERROR_TIME_OUT",
        c"Timer expired waiting for resource",
    ),
    (c"DOCA_ERROR_SHUTDOWN", c"Shut down in process or completed"),
    (c"DOCA_ERROR_CONNECTION_RESET", c"Connection reset by peer"),
    (c"DOCA_ERROR_CONNECTION_ABORTED", c"Connection aborted"),
    (
        c"DOCA_ERROR_CONNECTION_INPROGRESS",
        c"Connection in progress",
    ),
    (c"DOCA_ERROR_NOT_CONNECTED", c"Not connected"),
    (c"DOCA_ERROR_NO_LOCK", c"Unable to acquire required lock"),
    (c"DOCA_ERROR_NOT_FOUND", c"Resource not found"),
    (c"DOCA_ERROR_IO_FAILED", c"Input/output operation failed"),
    (c"DOCA_ERROR_BAD_STATE", c"Bad state"),
    (c"DOCA_ERROR_UNSUPPORTED_VERSION", c"Unsupported version"),
    (
        c"DOCA_ERROR_OPERATING_SYSTEM",
        c"Operating system call failure",
    ),
    (c"DOCA_ERROR_DRIVER", c"DOCA driver call failure"),
    (c"DOCA_ERROR_UNEXPECTED", c"Unexpected result"),
    (c"DOCA_ERROR_ALREADY_EXIST", c"Resource already exists"),
    (c"DOCA_ERROR_FULL", c"No more space in resource"),
    (c"DOCA_ERROR_EMPTY", c"No entry is available in resource"),
    (c"DOCA_ERROR_IN_PROGRESS", c"Operation is in progress"),
    (
        c"DOCA_ERROR_TOO_BIG",
        c"Requested operation too big to be contained",
    ),
    (c"DOCA_ERROR_AUTHENTICATION", c"Authentication failure"),
    (c"DOCA_ERROR_BAD_CONFIG", c"Configuration is not valid"),
    (c"DOCA_ERROR_SKIPPED", c"Operation was skipped"),
];

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_error_get_name(error: doca_error_t) -> *const c_char {
    ERRORS
        .get(error as usize)
        .map_or(c"DOCA_ERROR_UNKNOWN_CODE", |e| e.0)
        .as_ptr()
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_error_get_descr(error: doca_error_t) -> *const c_char {
    ERRORS
        .get(error as usize)
        .map_or(c"Unknown error code", |e| e.1)
        .as_ptr()
}
