//! The provider's cost counters (`doca_sys::counters`): what each costly call adds. Its own
//! test binary (one process, one test), so no other test's calls land between two readings.
#![cfg(doca_sys_software)]
#![allow(missing_docs)]

mod common;

use common::*;
use doca_sys::*;

fn read() -> Counters {
    counters("mlx5_0").expect("the software provider counts mlx5_0")
}

#[test]
fn counters_count_registrations_exports_imports_submissions_and_buffers() {
    assert_eq!(counters("mlx9_9"), None, "unknown device");
    let other = counters("mlx5_1").unwrap();
    let start = read();

    // Two contexts, each with one started 4 KiB mmap.
    let a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let made = read().since(&start);
    assert_eq!(made.registrations, 2);
    assert_eq!(made.registered_bytes, 2 * 4096);
    assert_eq!(made.pinned_bytes - start.pinned_bytes, 2 * 4096);
    assert_eq!(
        (made.exports, made.imports, made.deregistrations),
        (0, 0, 0)
    );

    // One export, one import; exporting again counts again (each call is a call).
    let (aconn, _) = oob_pair(&a, &b);
    let before = read();
    let blob = b.export_mmap();
    let remote = a.import_mmap(&blob);
    let shared = read().since(&before);
    assert_eq!((shared.exports, shared.imports), (1, 1));
    assert_eq!(shared.registrations, 0, "an import pins nothing");

    // One write: one submission; moving bytes registers nothing.
    let before = read();
    let (src, dst) = (a.buf(0, 8, 8), a.remote_buf(remote, b.addr(0), 8, 0));
    let w = a.write(aconn, src, dst);
    assert_eq!(wait_events(&[&a], &a, 1), [Ev::Ok(w as usize)]);
    let wrote = read().since(&before);
    assert_eq!(wrote.task_submissions, 1);
    assert_eq!((wrote.registrations, wrote.imports), (0, 0));
    assert_eq!(
        wrote.buffers_taken, 2,
        "the local source and the remote destination"
    );

    // Moving a buffer's data section takes no buffer.
    let before = read();
    // SAFETY: a live buffer of a completed task; the range is inside it.
    unsafe { ok(doca_buf_set_data(src, a.addr(4), 4)) };
    assert_eq!(read().since(&before).buffers_taken, 0);

    // Destroying the import, then stopping and destroying a started mmap.
    let before = read();
    a.free(w);
    // SAFETY: the write completed, so its buffers are released here once; then no buffer
    // points into the imported mmap, and the mmaps are live and destroyed once.
    unsafe {
        ok(doca_buf_dec_refcount(src, std::ptr::null_mut()));
        ok(doca_buf_dec_refcount(dst, std::ptr::null_mut()));
        ok(doca_mmap_destroy(remote));
        let mut m = std::ptr::null_mut();
        let mem = Box::leak(vec![0u8; 8192].into_boxed_slice());
        ok(doca_mmap_create(&mut m));
        ok(doca_mmap_set_memrange(
            m,
            mem.as_mut_ptr().cast(),
            mem.len(),
        ));
        ok(doca_mmap_add_dev(m, a.dev));
        ok(doca_mmap_start(m));
        assert_eq!(read().pinned_bytes, before.pinned_bytes + 8192);
        ok(doca_mmap_stop(m));
        ok(doca_mmap_destroy(m));
    }
    let ended = read().since(&before);
    assert_eq!(ended.imports_destroyed, 1);
    assert_eq!((ended.registrations, ended.deregistrations), (1, 1));
    assert_eq!(
        ended.pinned_bytes, before.pinned_bytes,
        "unpinned once, at stop"
    );

    assert_eq!(
        counters("mlx5_1").unwrap(),
        other,
        "another device counts apart"
    );
}
