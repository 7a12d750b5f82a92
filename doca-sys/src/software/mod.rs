//! The in-process software provider: every function of `include/doca_rpc_sw.h`, implemented
//! in Rust as `#[no_mangle] extern "C"` symbols, so the crate's `extern "C"` declarations
//! resolve to it at link time. Built only with `cfg(doca_sys_software)`.
//!
//! It is a stand-in for tests that follows DOCA's documentation and NVIDIA's samples, not our
//! transport: data really moves between registered memories of the same process, and where
//! DOCA is silent the provider takes the stricter choice. `CONTRACT.md` (next to the crate's
//! README) lists, per function, the documented conditions, what the provider does, and the
//! test that proves it. The main rules:
//!
//! # Contract violations
//! Calls whose result DOCA documents as undefined, and documented misuses the provider can
//! detect but not report through a return value, are recorded: [`violations`] /
//! [`take_violations`] (also printed to stderr). Examples: a receive result getter outside its
//! validity (answers the poison value `0xDEADBEEF`), `doca_task_free` or a `set_*` accessor
//! on a submitted task, `doca_pe_progress` from a callback, an invalid task given to
//! `doca_task_submit` (which DOCA does not validate; the provider refuses it with
//! `INVALID_VALUE`), a released buffer. A correct caller leaves the list empty.
//!
//! # Devices
//! `mlx5_0` (`0000:03:00.0`) and `mlx5_1` (`0000:03:00.1`) support every RDMA task type
//! (maximum message 1 GiB, send and receive queues 32768). `mlx5_2` (`0000:03:00.2`) has no
//! RDMA: its `doca_rdma_cap_task_*_is_supported` answer `NOT_SUPPORTED`, its numeric
//! capability queries `DRIVER`, an RDMA context on it does not start (`NOT_SUPPORTED`).
//! `doca_dev_close` is `IN_USE` while a context or an mmap uses the device.
//!
//! # Contexts
//! - `doca_ctx_start` needs a progress engine (`NOT_CONNECTED`) and an idle context
//!   (`BAD_STATE`); it returns `DOCA_ERROR_IN_PROGRESS`: the context is `STARTING` and becomes
//!   `RUNNING` in a later `doca_pe_progress`. State callbacks run from progress, each while the
//!   context is in the state it announces: a state change waits until the callback of the
//!   previous one was delivered (so the `STARTING` callback cannot allocate tasks).
//! - Configuration calls (`doca_rdma_set_*`, `*_set_conf`, `doca_ctx_set_state_changed_cb`,
//!   `doca_rdma_set_connection_state_callbacks`) need an idle context: `BAD_STATE`
//!   otherwise. `doca_rdma_set_recv_queue_size` is always `NOT_SUPPORTED` (CPU data path);
//!   `doca_rdma_set_send_queue_size` above the device maximum is `NOT_SUPPORTED`. Permissions
//!   of a context are RDMA flags only (`INVALID_VALUE` otherwise).
//! - Task allocation, submission, listening, connecting, accepting, rejecting and
//!   disconnecting need `RUNNING` (`BAD_STATE`); `doca_rdma_export` / `doca_rdma_connect` need a
//!   started context (`STARTING`, as their documentation says, or `RUNNING`, as the samples do).
//! - `doca_ctx_stop` disconnects every connection (peers get their disconnection callback),
//!   stops listening, flushes posted receives and outstanding tasks (error completions), and
//!   returns `IN_PROGRESS` (state `STOPPING`) while tasks are in flight **or still allocated**.
//!   The context reaches `IDLE` in a later `doca_pe_progress` once every completion was
//!   delivered and every task freed. With nothing allocated it stops at once (`SUCCESS`).
//! - `doca_rdma_set_max_num_connections` defaults to 1, as a reminder to set it.
//!
//! # Connections
//! - RDMA CM is emulated by port number: `doca_rdma_start_listen_to_port(port)` registers the
//!   context process-wide (`CONNECTION_ABORTED` if the port is taken); `doca_rdma_connect_to_addr`
//!   with any address and that port reaches it. Nobody listening, or the server full: the
//!   client gets its failure callback. Otherwise the server's request callback runs from the
//!   server's progress; `accept` queues the established callback on both sides; `reject`
//!   queues the client's failure callback. Without a request callback requests are rejected.
//! - `doca_rdma_connection_disconnect` flushes the connection's outstanding tasks, and the peer
//!   gets its disconnection callback (CM connections only; the side that disconnects gets no
//!   callback). The peer's outstanding tasks are flushed too, and it must call
//!   `doca_rdma_connection_disconnect` to finish. Disconnecting twice is `INVALID_VALUE`.
//! - Out of band: `doca_rdma_export` creates a connection and a blob (`FULL` when all slots
//!   are used); `doca_rdma_connect(blob)` on each side pairs them (`CONNECTION_ABORTED` for a
//!   corrupted blob). No connection callbacks are called in this mode. A side may submit once
//!   it called `doca_rdma_connect`, but a task that reaches a peer which has not called it yet
//!   fails (its queue pair is not ready): nothing is queued until the peer connects.
//! - A connection takes tasks (allocation and submission; `NOT_CONNECTED` otherwise) once it
//!   is established as its side knows it: its established callback was delivered (RDMA CM; a
//!   server's connection is not established at accept) or `doca_rdma_connect` was called on it
//!   (out of band); and until it is disconnected.
//!
//! # Tasks
//! - `*_set_conf` sets the pool size (and both callbacks, non-NULL): allocating more than
//!   `num_tasks` tasks of that type gives `NO_MEMORY`. Completions are delivered only from
//!   `doca_pe_progress` of the submitting context's progress engine; a task is reusable after
//!   its callback, with the `set_*` accessors (also `*_set_rdma_connection`).
//! - A receive can be submitted once a connection of its context was established in the sense
//!   above: `NOT_CONNECTED` before.
//! - A send (also send-with-immediate and write-with-immediate) is matched with the oldest
//!   receive posted on the peer context (receives match any connection). If none is posted,
//!   it is receiver-not-ready: it tries again once per timer period of
//!   `DOCA_SYS_SW_RNR_TIMEOUT_MS` milliseconds (default 20, checked in the sender's progress),
//!   and fails when `rnr_retry_count + 1` periods ended without a receive
//!   (`doca_rdma_set_rnr_retry_count` of the sending context, 0 until set: one period; 7:
//!   it waits until a receive comes or the connection ends, as verbs' `rnr_retry = 7`).
//!   Values above 7 are `INVALID_VALUE`.
//! - `doca_task_submit_ex` without `DOCA_TASK_SUBMIT_FLAG_FLUSH` accepts a task (same checks
//!   and codes as `doca_task_submit`; DOCA owns it) but does not start it: no data moves, no
//!   receive is posted, nothing completes, until a later submit with `FLUSH` on the same
//!   context (earlier tasks start first, in submission order) or `doca_ctx_flush_tasks`.
//!   `doca_task_submit` is a submit with `FLUSH`. A disconnection, an error of the task's
//!   connection or `doca_ctx_stop` completes unflushed tasks like any other (once).
//!   `OPTIMIZE_REPORTS` is accepted and changes nothing; unknown flag bits are
//!   `INVALID_VALUE` (and a violation). `doca_ctx_flush_tasks` on an idle or unknown context
//!   is a violation.
//! - "No data" is a NULL buffer (DOCA documents it for send, send-with-immediate, receive,
//!   read and write); a non-NULL source with an empty data section is refused at submit
//!   (`INVALID_VALUE`). Atomics act on the first 8 bytes of the destination's data (fewer:
//!   `INVALID_VALUE` at submit).
//! - A receive appends after its buffer's data section and grows the data length. A message
//!   larger than the free space fails the receive and the send and puts both connections in
//!   error. Write-with-immediate consumes a receive with result length 0 and leaves its buffer
//!   untouched.
//! - Write appends the source's data section after the remote buffer's data section (and grows
//!   the local descriptor's data length); read copies the remote buffer's data section after
//!   the local buffer's data section; atomics act on the 8 aligned bytes at the remote buffer's
//!   data address and append the previous value (native endian) to the result buffer.
//!   They need no peer task. The remote buffer must come from an mmap created from an export
//!   with the context's device, and the export must be for the device of the peer context the
//!   connection reaches (a key is valid only on its device); local buffers from an mmap with
//!   the context's device (local write access where the task writes them). Remote access is checked against the exporting
//!   mmap (it must still exist, cover the range and grant `RDMA_WRITE` / `RDMA_READ` /
//!   `RDMA_ATOMIC`) and the peer context's `doca_rdma_set_permissions`.
//! - A failed task completes with `DOCA_ERROR_IO_FAILED` and puts its connection in error:
//!   every other outstanding task of that connection completes (once) with
//!   `DOCA_ERROR_CONNECTION_ABORTED`, tasks submitted later on it too, and it must be
//!   disconnected. Other connections of the context keep working.
//! - Submitting on a connection that is not established gives `NOT_CONNECTED`.
//!
//! # Memory
//! mmaps check ranges and states as `doca_mmap.h` documents: `NOT_PERMITTED` to destroy or
//! stop one with buffers out, to stop an exported or imported one, to set its range twice;
//! `doca_mmap_set_permissions` refuses undefined flags and remote write or atomic access
//! without local write access. `doca_mmap_export_rdma` needs a started mmap with an RDMA
//! permission (`NOT_PERMITTED`) and the device added (`NOT_FOUND`); its descriptor is for that
//! device and names it (one per device). A buffer inventory gives
//! `NO_MEMORY` when all its buffers are out; it can be stopped with buffers out (no more can
//! be taken). `doca_buf_inventory_expand` grows a started inventory (`BAD_STATE` otherwise;
//! 0 elements or a total above `u32::MAX` is `INVALID_VALUE`), buffers out or not. `doca_buf_dec_refcount` reports the count before the call; released descriptors
//! are reused.
//!
//! # Progress engine
//! Any number of contexts may be connected to one engine; its `doca_pe_progress` serves all of
//! them, one callback per call (in queue order): progress until it returns 0.
//! `doca_pe_get_notification_handle` returns an eventfd. After `doca_pe_request_notification`
//! it becomes readable as soon as a **task completion** is pending (at once if one already
//! is, including a receiver-not-ready timer period that ends later: each retry of a waiting
//! send wakes it once); `doca_pe_clear_notification`
//! drains it. Connection events and state changes never signal it: `doca_pe_progress`
//! delivers them when called.
//!
//! # Threads
//! All state is process-global behind one mutex; contexts may be progressed from different
//! threads. Callbacks run without the lock held, so they may call any function except
//! `doca_pe_progress`.

mod cm;
mod connection;
mod counters;
mod device;
mod errors;
mod memory;
mod nic;
mod objects;
mod oob;
mod pe;
mod rdma;
mod tasks;
mod violations;
mod world;

use crate::ffi::*;
use objects::*;
use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::io::Write as _;
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

pub use counters::counters;
pub use violations::{take_violations, violations};

/// Status of the task that failed (remote access, receiver not ready, length).
const ERR_TASK: doca_error_t = DOCA_ERROR_IO_FAILED;
/// Status of the tasks flushed from a connection in error, disconnected, or stopping.
const ERR_FLUSH: doca_error_t = DOCA_ERROR_CONNECTION_ABORTED;

use violations::record as violation;
use world::*;

thread_local! {
    /// Set while this thread runs callbacks inside `doca_pe_progress`.
    static IN_PROGRESS: Cell<bool> = const { Cell::new(false) };
    /// The receive task whose successful completion callback this thread is running (0: none).
    static SUCCESS_CB_TASK: Cell<H> = const { Cell::new(0) };
}

#[cfg(test)]
mod signatures {
    use super::{
        cm::*, connection::*, device::*, errors::*, memory::*, oob::*, pe::*, rdma::*, tasks::*,
    };

    /// Each software function must have exactly the type of its generated declaration: the
    /// `if` only compiles when both function items coerce to one function pointer type.
    macro_rules! same_signature {
        ($($f:ident),* $(,)?) => {
            {$( let _ = if true { crate::ffi::$f } else { $f }; )*}
        };
    }

    #[test]
    fn software_functions_match_the_header() {
        include!("signature_list.rs");
    }
}
