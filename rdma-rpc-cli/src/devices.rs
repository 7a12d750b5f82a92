//! `devices`: what DOCA sees, as doca-cpp's device discovery sample prints it.

use std::process::ExitCode;

use rdma_rpc_core::transport::doca::{list_devices, DeviceInfo};

/// Prints every DOCA device: a table, or JSON.
pub(crate) fn list(json: bool) -> ExitCode {
    let devices = match list_devices() {
        Ok(devices) => devices,
        Err(e) => return crate::fail("cannot list DOCA devices", &e),
    };
    let provider = doca_sys::provider();
    if json {
        let list: Vec<_> = devices.iter().map(to_json).collect();
        let out = serde_json::json!({ "provider": provider.to_string(), "devices": list });
        println!("{out:#}");
        return ExitCode::SUCCESS;
    }
    println!(
        "{} device{} ({provider})",
        devices.len(),
        if devices.len() == 1 { "" } else { "s" }
    );
    println!(
        "{:<10} {:<14} {:<32} {:>12} {:>9} {:>9}",
        "name", "pci", "rdma tasks", "max message", "send q", "recv q"
    );
    for d in &devices {
        let tasks = match tasks(d) {
            t if t.is_empty() => "none".to_owned(),
            t => t.join(","),
        };
        println!(
            "{:<10} {:<14} {:<32} {:>12} {:>9} {:>9}",
            d.name,
            d.pci_addr,
            tasks,
            d.max_message_size,
            d.max_send_queue_size,
            d.max_recv_queue_size
        );
    }
    if !devices.iter().any(|d| tasks(d).len() == 4) {
        eprintln!(
            "no device supports every RDMA task rdma-rpc uses (send/receive, write, read, atomics)"
        );
    }
    ExitCode::SUCCESS
}

/// The RDMA task types a device supports.
fn tasks(d: &DeviceInfo) -> Vec<&'static str> {
    let c = d.capabilities;
    let all = [
        (c.send_recv, "send/receive"),
        (c.write, "write"),
        (c.read, "read"),
        (c.atomics, "atomics"),
    ];
    all.iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| *name)
        .collect()
}

fn to_json(d: &DeviceInfo) -> serde_json::Value {
    let c = d.capabilities;
    serde_json::json!({
        "name": d.name,
        "pci_addr": d.pci_addr,
        "capabilities": {
            "send_recv": c.send_recv,
            "write": c.write,
            "read": c.read,
            "atomics": c.atomics,
        },
        "max_message_size": d.max_message_size,
        "max_send_queue_size": d.max_send_queue_size,
        "max_recv_queue_size": d.max_recv_queue_size,
    })
}
