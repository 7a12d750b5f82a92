//! Memory maps, buffer inventories and buffers.

use super::*;

const MMAP_BLOB_MAGIC: &[u8; 8] = b"DSWMMAP1";
/// Magic, exporting mmap id, address, length, permissions, device index.
const MMAP_BLOB_LEN: usize = 8 + 8 + 8 + 8 + 4 + 4;
const RDMA_ACCESS: u32 =
    DOCA_ACCESS_FLAG_RDMA_READ | DOCA_ACCESS_FLAG_RDMA_WRITE | DOCA_ACCESS_FLAG_RDMA_ATOMIC;
/// Every access flag DOCA defines.
const DEFINED_ACCESS: u32 = DOCA_ACCESS_FLAG_LOCAL_READ_WRITE
    | RDMA_ACCESS
    | DOCA_ACCESS_FLAG_PCI_READ_ONLY
    | DOCA_ACCESS_FLAG_PCI_READ_WRITE
    | DOCA_ACCESS_FLAG_PCI_RELAXED_ORDERING;

/// Whether an access mask is valid for `doca_mmap_set_permissions`: only defined flags;
/// remote write or remote atomic access only with local write access (as `ibv_reg_mr`
/// requires); not PCI read-only and PCI read-write together (stricter choice).
pub(super) fn valid_mmap_access(mask: u32) -> bool {
    let remote_write = DOCA_ACCESS_FLAG_RDMA_WRITE | DOCA_ACCESS_FLAG_RDMA_ATOMIC;
    let both_pci = DOCA_ACCESS_FLAG_PCI_READ_ONLY | DOCA_ACCESS_FLAG_PCI_READ_WRITE;
    mask & !DEFINED_ACCESS == 0
        && (mask & remote_write == 0 || mask & DOCA_ACCESS_FLAG_LOCAL_READ_WRITE != 0)
        && mask & both_pci != both_pci
}

fn new_mmap(w: &mut World) -> H {
    let h = new_handle();
    w.mmaps.insert(
        h,
        Mmap {
            started: false,
            addr: 0,
            len: 0,
            permissions: DOCA_ACCESS_FLAG_LOCAL_READ_WRITE,
            devs: Vec::new(),
            remote: None,
            exported_for: None,
            id: 0,
            exports: Vec::new(),
            bufs: 0,
        },
    );
    h
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_mmap_create(mmap: *mut *mut doca_mmap) -> doca_error_t {
    if mmap.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let h = new_mmap(&mut world());
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *mmap = h as *mut doca_mmap };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_mmap_destroy(mmap: *mut doca_mmap) -> doca_error_t {
    let mut w = world();
    let m = match w.mmaps.get(&(mmap as H)) {
        None => return DOCA_ERROR_INVALID_VALUE,
        // Buffers still point into it.
        Some(m) if m.bufs > 0 => return DOCA_ERROR_NOT_PERMITTED,
        Some(m) => m.id,
    };
    let gone = w.mmaps.remove(&(mmap as H)).expect("checked above");
    gone.count_teardown();
    w.mmap_ids.remove(&m);
    free_handle(mmap as H);
    DOCA_SUCCESS
}

/// Runs `f` on a local mmap that is not started: `remote_code` for an mmap created from an
/// export, `BAD_STATE` for a started one.
fn with_stopped(
    mmap: *mut doca_mmap,
    remote_code: doca_error_t,
    f: impl FnOnce(&mut Mmap) -> doca_error_t,
) -> doca_error_t {
    let mut w = world();
    match w.mmaps.get_mut(&(mmap as H)) {
        None => DOCA_ERROR_INVALID_VALUE,
        Some(m) if m.remote.is_some() => remote_code,
        Some(m) if m.started => DOCA_ERROR_BAD_STATE,
        Some(m) => f(m),
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_mmap_start(mmap: *mut doca_mmap) -> doca_error_t {
    let h = mmap as H;
    let mut w = world();
    let next_id = w.next_mmap_id + 1;
    let Some(m) = w.mmaps.get_mut(&h) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if m.remote.is_some() || m.exported() {
        return DOCA_ERROR_NOT_PERMITTED;
    }
    if m.started || m.len == 0 {
        // Stricter choice: starting twice, or without a memory range, is refused.
        return DOCA_ERROR_BAD_STATE;
    }
    m.started = true;
    for &dev in &m.devs {
        super::counters::registered(dev, m.len);
    }
    if m.id == 0 {
        m.id = next_id;
        w.next_mmap_id = next_id;
        w.mmap_ids.insert(next_id, h);
    }
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_mmap_stop(mmap: *mut doca_mmap) -> doca_error_t {
    let mut w = world();
    match w.mmaps.get_mut(&(mmap as H)) {
        None => DOCA_ERROR_INVALID_VALUE,
        // Exported, created from an export, or buffers still point into it.
        Some(m) if m.remote.is_some() || m.exported() || m.bufs > 0 => DOCA_ERROR_NOT_PERMITTED,
        // Stricter choice: stopping a stopped mmap is refused.
        Some(m) if !m.started => DOCA_ERROR_BAD_STATE,
        Some(m) => {
            m.started = false;
            for &dev in &m.devs {
                super::counters::deregistered(dev, m.len);
            }
            DOCA_SUCCESS
        }
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_mmap_set_memrange(
    mmap: *mut doca_mmap,
    addr: *mut c_void,
    len: usize,
) -> doca_error_t {
    if addr.is_null() || len == 0 || (addr as usize).checked_add(len).is_none() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    with_stopped(mmap, DOCA_ERROR_NOT_PERMITTED, |m| {
        if m.len != 0 {
            // The memory range can be set only once.
            return DOCA_ERROR_NOT_PERMITTED;
        }
        m.addr = addr as usize;
        m.len = len;
        DOCA_SUCCESS
    })
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_mmap_set_permissions(
    mmap: *mut doca_mmap,
    access_mask: u32,
) -> doca_error_t {
    if !valid_mmap_access(access_mask) {
        return DOCA_ERROR_INVALID_VALUE;
    }
    with_stopped(mmap, DOCA_ERROR_BAD_STATE, |m| {
        m.permissions = access_mask;
        DOCA_SUCCESS
    })
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_mmap_add_dev(
    mmap: *mut doca_mmap,
    dev: *mut doca_dev,
) -> doca_error_t {
    if dev.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let mut w = world();
    match w.mmaps.get_mut(&(mmap as H)) {
        None => DOCA_ERROR_INVALID_VALUE,
        // Started, exported, or created from an export.
        Some(m) if m.started || m.remote.is_some() => DOCA_ERROR_NOT_PERMITTED,
        Some(m) if m.has_device(dev as H) => DOCA_ERROR_ALREADY_EXIST,
        Some(m) => {
            m.devs.push(dev as usize);
            DOCA_SUCCESS
        }
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_mmap_export_rdma(
    mmap: *mut doca_mmap,
    dev: *const doca_dev,
    export_desc: *mut *const c_void,
    export_desc_len: *mut usize,
) -> doca_error_t {
    if export_desc.is_null() || export_desc_len.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let mut w = world();
    let Some(m) = w.mmaps.get_mut(&(mmap as H)) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    // Created from an export, not started, or without an RDMA access permission.
    if m.remote.is_some() || !m.started || m.permissions & RDMA_ACCESS == 0 {
        return DOCA_ERROR_NOT_PERMITTED;
    }
    if !m.has_device(dev as H) {
        return DOCA_ERROR_NOT_FOUND;
    }
    // SAFETY: an added device is open (`doca_dev_close` refuses while an mmap holds it).
    if !unsafe { super::device::rdma_supported(dev as H) } {
        return DOCA_ERROR_NOT_SUPPORTED;
    }
    // SAFETY: as above.
    let Some(index) = (unsafe { super::device::device_index(dev as H) }) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    // The descriptor is "for the device provided as dev" (doca_mmap.h): one per device,
    // naming it. Exporting again for the same device gives the same descriptor.
    let at = match m.exports.iter().position(|e| e.dev == index) {
        Some(at) => at,
        None => {
            let mut blob = Vec::with_capacity(MMAP_BLOB_LEN);
            blob.extend_from_slice(MMAP_BLOB_MAGIC);
            blob.extend_from_slice(&m.id.to_le_bytes());
            blob.extend_from_slice(&(m.addr as u64).to_le_bytes());
            blob.extend_from_slice(&(m.len as u64).to_le_bytes());
            blob.extend_from_slice(&m.permissions.to_le_bytes());
            blob.extend_from_slice(&(index as u32).to_le_bytes());
            m.exports.push(Export { dev: index, blob });
            m.exports.len() - 1
        }
    };
    let blob = &m.exports[at].blob;
    super::counters::exported(dev as H);
    // SAFETY: out-pointers checked non-null; the blob's bytes stay in place as long as the
    // mmap lives (a descriptor is never changed or dropped before the mmap).
    unsafe {
        *export_desc = blob.as_ptr().cast();
        *export_desc_len = blob.len();
    }
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_mmap_create_from_export(
    _user_data: *const doca_data,
    export_desc: *const c_void,
    export_desc_len: usize,
    dev: *mut doca_dev,
    mmap: *mut *mut doca_mmap,
) -> doca_error_t {
    if export_desc.is_null() || export_desc_len != MMAP_BLOB_LEN || dev.is_null() || mmap.is_null()
    {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller gives `export_desc_len` readable bytes.
    let blob = unsafe { std::slice::from_raw_parts(export_desc.cast::<u8>(), MMAP_BLOB_LEN) };
    if &blob[..8] != MMAP_BLOB_MAGIC {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: `dev` is an open device per the contract.
    if !unsafe { super::device::rdma_supported(dev as H) } {
        return DOCA_ERROR_NOT_SUPPORTED;
    }
    let u64_at = |i: usize| u64::from_le_bytes(blob[i..i + 8].try_into().expect("8 bytes"));
    let (id, addr, len) = (u64_at(8), u64_at(16) as usize, u64_at(24) as usize);
    let permissions = u32::from_le_bytes(blob[32..36].try_into().expect("4 bytes"));
    let exported_for = u32::from_le_bytes(blob[36..40].try_into().expect("4 bytes")) as usize;
    if exported_for >= super::device::NUM_DEVS {
        // Names no device: not a descriptor `doca_mmap_export_rdma` made.
        return DOCA_ERROR_INVALID_VALUE;
    }
    let mut w = world();
    let h = new_mmap(&mut w);
    let m = w.mmaps.get_mut(&h).expect("just created");
    m.started = true;
    m.addr = addr;
    m.len = len;
    m.permissions = permissions;
    m.devs.push(dev as usize);
    m.remote = Some(id);
    m.exported_for = Some(exported_for);
    super::counters::imported(dev as H);
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *mmap = h as *mut doca_mmap };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_inventory_create(
    num_elements: usize,
    buf_inventory: *mut *mut doca_buf_inventory,
) -> doca_error_t {
    if num_elements == 0 || buf_inventory.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let h = new_handle();
    world().invs.insert(
        h,
        Inventory {
            capacity: num_elements,
            used: 0,
            started: false,
            free: Vec::new(),
        },
    );
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *buf_inventory = h as *mut doca_buf_inventory };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_inventory_destroy(
    inventory: *mut doca_buf_inventory,
) -> doca_error_t {
    let mut w = world();
    match w.invs.get(&(inventory as H)) {
        None => return DOCA_ERROR_INVALID_VALUE,
        Some(i) if i.used > 0 => return DOCA_ERROR_IN_USE,
        Some(_) => {}
    }
    let inv = w.invs.remove(&(inventory as H)).expect("checked above");
    for buf in inv.free {
        w.bufs.remove(&buf);
        free_handle(buf);
    }
    free_handle(inventory as H);
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_inventory_start(
    inventory: *mut doca_buf_inventory,
) -> doca_error_t {
    match world().invs.get_mut(&(inventory as H)) {
        None => DOCA_ERROR_INVALID_VALUE,
        Some(i) if i.started => DOCA_ERROR_BAD_STATE,
        Some(i) => {
            i.started = true;
            DOCA_SUCCESS
        }
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_inventory_stop(
    inventory: *mut doca_buf_inventory,
) -> doca_error_t {
    match world().invs.get_mut(&(inventory as H)) {
        None => DOCA_ERROR_INVALID_VALUE,
        // Stricter choice: stopping a stopped inventory is refused. Buffers that are out stay
        // valid (no failure is documented for them); no new ones can be taken.
        Some(i) if !i.started => DOCA_ERROR_BAD_STATE,
        Some(i) => {
            i.started = false;
            DOCA_SUCCESS
        }
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_inventory_expand(
    inventory: *mut doca_buf_inventory,
    num_elements: u32,
) -> doca_error_t {
    let mut w = world();
    let Some(i) = w.invs.get_mut(&(inventory as H)) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if !i.started {
        // Documented: only a started inventory expands.
        return DOCA_ERROR_BAD_STATE;
    }
    // Stricter choices: adding nothing is an invalid input, and so is a total the inventory's
    // `uint32_t` element count (doca_buf_inventory_get_num_elements) could not report.
    match i.capacity.checked_add(num_elements as usize) {
        Some(total) if num_elements > 0 && total <= u32::MAX as usize => {
            i.capacity = total;
            DOCA_SUCCESS
        }
        _ => DOCA_ERROR_INVALID_VALUE,
    }
}

/// Whether `[start, start + len)` lies inside `[outer, outer + outer_len)`.
pub(super) fn contains(outer: usize, outer_len: usize, start: usize, len: usize) -> bool {
    start >= outer
        && start
            .checked_add(len)
            .is_some_and(|end| end <= outer + outer_len)
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_inventory_buf_get_by_args(
    inventory: *mut doca_buf_inventory,
    mmap: *mut doca_mmap,
    addr: *mut c_void,
    len: usize,
    data: *mut c_void,
    data_len: usize,
    buf: *mut *mut doca_buf,
) -> doca_error_t {
    let (inv, mm) = (inventory as H, mmap as H);
    let (addr, data) = (addr as usize, data as usize);
    if buf.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let mut w = world();
    let (Some(i), Some(m)) = (w.invs.get(&inv), w.mmaps.get(&mm)) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if !i.started || !m.started {
        return DOCA_ERROR_BAD_STATE;
    }
    if !contains(m.addr, m.len, addr, len) {
        // No suitable memory range.
        return DOCA_ERROR_INVALID_VALUE;
    }
    if !contains(addr, len, data, data_len) {
        violation(format!(
            "doca_buf_inventory_buf_get_by_args(inventory {inv:#x}): the data section \
             [{data:#x}, +{data_len}) is not inside the buffer [{addr:#x}, +{len}) (undefined)"
        ));
        return DOCA_ERROR_INVALID_VALUE;
    }
    if i.used >= i.capacity {
        return DOCA_ERROR_NO_MEMORY;
    }
    let i = w.invs.get_mut(&inv).expect("checked");
    i.used += 1;
    let h = i.free.pop().unwrap_or_else(new_handle);
    let m = w.mmaps.get_mut(&mm).expect("checked");
    m.bufs += 1;
    for &dev in &m.devs {
        super::counters::buffer_taken(dev);
    }
    w.bufs.insert(
        h,
        Buf {
            inv,
            mmap: mm,
            addr,
            len,
            data,
            data_len,
            refcount: 1,
        },
    );
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *buf = h as *mut doca_buf };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_dec_refcount(
    buf: *mut doca_buf,
    refcount: *mut u16,
) -> doca_error_t {
    let h = buf as H;
    let mut w = world();
    let Some(b) = w.bufs.get_mut(&h) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if b.refcount == 0 {
        return DOCA_ERROR_BAD_STATE;
    }
    // Reported: the count before this call.
    let before = b.refcount;
    b.refcount -= 1;
    if b.refcount == 0 {
        let (inv, mmap) = (b.inv, b.mmap);
        if let Some(i) = w.invs.get_mut(&inv) {
            i.used -= 1;
            i.free.push(h);
        }
        if let Some(m) = w.mmaps.get_mut(&mmap) {
            m.bufs -= 1;
        }
    }
    if !refcount.is_null() {
        // SAFETY: checked non-null; writable per the contract.
        unsafe { *refcount = before };
    }
    DOCA_SUCCESS
}

/// Runs `f` on a live buffer. DOCA documents the buffer accessors as always succeeding on a
/// valid buffer with valid arguments; anything else is a recorded violation (`INVALID_VALUE`).
fn with_buf(
    function: &str,
    buf: H,
    args_ok: bool,
    f: impl FnOnce(&mut Buf) -> doca_error_t,
) -> doca_error_t {
    let mut w = world();
    match w.bufs.get_mut(&buf) {
        Some(b) if b.refcount > 0 && args_ok => f(b),
        Some(b) if b.refcount > 0 => {
            violation(format!("{function}(buf {buf:#x}): a NULL argument"));
            DOCA_ERROR_INVALID_VALUE
        }
        Some(_) => {
            violation(format!(
                "{function}(buf {buf:#x}): the buffer was released (reference count 0)"
            ));
            DOCA_ERROR_INVALID_VALUE
        }
        None => {
            violation(format!("{function}(buf {buf:#x}): not a DOCA buffer"));
            DOCA_ERROR_INVALID_VALUE
        }
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_get_data(
    buf: *const doca_buf,
    data: *mut *mut c_void,
) -> doca_error_t {
    with_buf("doca_buf_get_data", buf as H, !data.is_null(), |b| {
        // SAFETY: checked non-null; writable per the contract.
        unsafe { *data = b.data as *mut c_void };
        DOCA_SUCCESS
    })
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_get_data_len(
    buf: *const doca_buf,
    data_len: *mut usize,
) -> doca_error_t {
    with_buf(
        "doca_buf_get_data_len",
        buf as H,
        !data_len.is_null(),
        |b| {
            // SAFETY: checked non-null; writable per the contract.
            unsafe { *data_len = b.data_len };
            DOCA_SUCCESS
        },
    )
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_set_data(
    buf: *mut doca_buf,
    data: *mut c_void,
    data_len: usize,
) -> doca_error_t {
    let h = buf as H;
    with_buf("doca_buf_set_data", h, !data.is_null(), |b| {
        if !contains(b.addr, b.len, data as usize, data_len) {
            violation(format!(
                "doca_buf_set_data(buf {h:#x}): [{:#x}, +{data_len}) is not inside the buffer \
                 [{:#x}, +{}) (undefined); the buffer was left unchanged",
                data as usize, b.addr, b.len
            ));
            return DOCA_ERROR_INVALID_VALUE;
        }
        b.data = data as usize;
        b.data_len = data_len;
        DOCA_SUCCESS
    })
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_reset_data_len(buf: *mut doca_buf) -> doca_error_t {
    with_buf("doca_buf_reset_data_len", buf as H, true, |b| {
        b.data_len = 0;
        DOCA_SUCCESS
    })
}
