//! Memory maps, buffer inventories and buffers.

use super::*;

const MMAP_BLOB_MAGIC: &[u8; 8] = b"DSWMMAP1";
const MMAP_BLOB_LEN: usize = 8 + 8 + 8 + 8 + 4;
const RDMA_ACCESS: u32 =
    DOCA_ACCESS_FLAG_RDMA_READ | DOCA_ACCESS_FLAG_RDMA_WRITE | DOCA_ACCESS_FLAG_RDMA_ATOMIC;

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
            id: 0,
            blob: Vec::new(),
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
        Some(m) if m.bufs > 0 => return DOCA_ERROR_IN_USE,
        Some(m) => m.id,
    };
    w.mmaps.remove(&(mmap as H));
    w.mmap_ids.remove(&m);
    free_handle(mmap as H);
    DOCA_SUCCESS
}

/// Runs `f` on a local mmap that is not started (`BAD_STATE` otherwise).
fn with_stopped(mmap: *mut doca_mmap, f: impl FnOnce(&mut Mmap) -> doca_error_t) -> doca_error_t {
    let mut w = world();
    match w.mmaps.get_mut(&(mmap as H)) {
        None => DOCA_ERROR_INVALID_VALUE,
        Some(m) if m.started || m.remote.is_some() => DOCA_ERROR_BAD_STATE,
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
    if m.started || m.remote.is_some() {
        return DOCA_ERROR_BAD_STATE;
    }
    if m.len == 0 {
        return DOCA_ERROR_BAD_STATE;
    }
    m.started = true;
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
        Some(m) if !m.started => DOCA_ERROR_BAD_STATE,
        Some(m) if m.bufs > 0 => DOCA_ERROR_IN_USE,
        Some(m) => {
            m.started = false;
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
    with_stopped(mmap, |m| {
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
    with_stopped(mmap, |m| {
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
    with_stopped(mmap, |m| {
        if !m.devs.contains(&(dev as usize)) {
            m.devs.push(dev as usize);
        }
        DOCA_SUCCESS
    })
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
    if m.remote.is_some() {
        return DOCA_ERROR_NOT_PERMITTED;
    }
    if !m.started {
        return DOCA_ERROR_BAD_STATE;
    }
    if !m.devs.contains(&(dev as usize)) {
        return DOCA_ERROR_INVALID_VALUE;
    }
    if m.permissions & RDMA_ACCESS == 0 {
        return DOCA_ERROR_NOT_PERMITTED;
    }
    m.blob.clear();
    m.blob.extend_from_slice(MMAP_BLOB_MAGIC);
    m.blob.extend_from_slice(&m.id.to_le_bytes());
    m.blob.extend_from_slice(&(m.addr as u64).to_le_bytes());
    m.blob.extend_from_slice(&(m.len as u64).to_le_bytes());
    m.blob.extend_from_slice(&m.permissions.to_le_bytes());
    // SAFETY: out-pointers checked non-null; the blob lives as long as the mmap.
    unsafe {
        *export_desc = m.blob.as_ptr().cast();
        *export_desc_len = m.blob.len();
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
    let u64_at = |i: usize| u64::from_le_bytes(blob[i..i + 8].try_into().expect("8 bytes"));
    let (id, addr, len) = (u64_at(8), u64_at(16) as usize, u64_at(24) as usize);
    let permissions = u32::from_le_bytes(blob[32..36].try_into().expect("4 bytes"));
    let mut w = world();
    let h = new_mmap(&mut w);
    let m = w.mmaps.get_mut(&h).expect("just created");
    m.started = true;
    m.addr = addr;
    m.len = len;
    m.permissions = permissions;
    m.devs.push(dev as usize);
    m.remote = Some(id);
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
    w.invs.remove(&(inventory as H));
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
        Some(i) if !i.started => DOCA_ERROR_BAD_STATE,
        Some(i) if i.used > 0 => DOCA_ERROR_IN_USE,
        Some(i) => {
            i.started = false;
            DOCA_SUCCESS
        }
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
    if !contains(m.addr, m.len, addr, len) || !contains(addr, len, data, data_len) {
        return DOCA_ERROR_INVALID_VALUE;
    }
    if i.used >= i.capacity {
        return DOCA_ERROR_NO_MEMORY;
    }
    w.invs.get_mut(&inv).expect("checked").used += 1;
    w.mmaps.get_mut(&mm).expect("checked").bufs += 1;
    let h = new_handle();
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
    b.refcount -= 1;
    let left = b.refcount;
    if left == 0 {
        let b = w.bufs.remove(&h).expect("checked");
        if let Some(i) = w.invs.get_mut(&b.inv) {
            i.used -= 1;
        }
        if let Some(m) = w.mmaps.get_mut(&b.mmap) {
            m.bufs -= 1;
        }
        free_handle(h);
    }
    if !refcount.is_null() {
        // SAFETY: checked non-null; writable per the contract.
        unsafe { *refcount = left };
    }
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_get_data(
    buf: *const doca_buf,
    data: *mut *mut c_void,
) -> doca_error_t {
    let w = world();
    match w.bufs.get(&(buf as H)) {
        Some(b) if !data.is_null() => {
            // SAFETY: checked non-null; writable per the contract.
            unsafe { *data = b.data as *mut c_void };
            DOCA_SUCCESS
        }
        _ => DOCA_ERROR_INVALID_VALUE,
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_get_data_len(
    buf: *const doca_buf,
    data_len: *mut usize,
) -> doca_error_t {
    let w = world();
    match w.bufs.get(&(buf as H)) {
        Some(b) if !data_len.is_null() => {
            // SAFETY: checked non-null; writable per the contract.
            unsafe { *data_len = b.data_len };
            DOCA_SUCCESS
        }
        _ => DOCA_ERROR_INVALID_VALUE,
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_set_data(
    buf: *mut doca_buf,
    data: *mut c_void,
    data_len: usize,
) -> doca_error_t {
    let mut w = world();
    match w.bufs.get_mut(&(buf as H)) {
        Some(b) if contains(b.addr, b.len, data as usize, data_len) => {
            b.data = data as usize;
            b.data_len = data_len;
            DOCA_SUCCESS
        }
        _ => DOCA_ERROR_INVALID_VALUE,
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_buf_reset_data_len(buf: *mut doca_buf) -> doca_error_t {
    match world().bufs.get_mut(&(buf as H)) {
        Some(b) => {
            b.data_len = 0;
            DOCA_SUCCESS
        }
        None => DOCA_ERROR_INVALID_VALUE,
    }
}
