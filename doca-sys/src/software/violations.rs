//! Calls whose result DOCA documents as undefined, and documented misuses the provider can
//! detect but not report through a return value.

use super::*;

static VIOLATIONS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn list() -> MutexGuard<'static, Vec<String>> {
    VIOLATIONS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records a contract violation (and prints it to stderr, so a test log shows it).
pub(super) fn record(message: String) {
    let _ = writeln!(
        std::io::stderr(),
        "doca-sys software provider: contract violation: {message}"
    );
    list().push(message);
}

/// Every contract violation recorded so far in this process, oldest first.
///
/// A violation is a call whose result DOCA documents as undefined (for example
/// `doca_rdma_task_receive_get_result_immediate_data` on a receive that carried no
/// immediate), or a documented misuse the provider detects but cannot report through a
/// return value (for example `doca_task_free` on a submitted task, or `doca_pe_progress`
/// called from a callback). Each entry names the function and the object handle
/// (`0x...`). A correct caller leaves this list empty; see `CONTRACT.md`.
///
/// The list is process-wide: tests running in parallel share it.
pub fn violations() -> Vec<String> {
    list().clone()
}

/// Like [`violations`], and empties the list.
pub fn take_violations() -> Vec<String> {
    std::mem::take(&mut *list())
}
