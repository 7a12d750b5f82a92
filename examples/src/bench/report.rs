//! The benchmark's results: a plain-text table with ratios to the baselines, JSON, and an
//! SVG chart of latency and throughput against payload size.

use std::fmt::Write as _;

use serde::Serialize;

use super::copy_baseline::CopyRates;
use super::measure::{Latency, Throughput};
use crate::report::size;

/// `a / b` for the table, or `-` without a baseline.
fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

/// A chart line: name, colour, and (payload size, p50 latency in us, GB/s) points.
type Series<'a> = (&'a str, &'a str, Vec<(usize, f64, f64)>);

/// One rdma-rpc operation at one payload size.
#[derive(Debug, Clone, Serialize)]
pub struct OpRow {
    /// `send`, `receive`, `write` or `read`.
    pub op: &'static str,
    /// Payload bytes.
    pub size: usize,
    /// One call in flight.
    pub latency: Latency,
    /// Protocol round trips per call, measured.
    pub round_trips: f64,
    /// Memory registrations per call once warm, both ends together (DOCA over the software
    /// provider, which counts them; `None` elsewhere).
    pub registrations_per_call: Option<f64>,
    /// Imports of a peer's memory per call once warm, both ends together (as above).
    pub imports_per_call: Option<f64>,
    /// Several calls in flight on one connection.
    pub one_connection: Throughput,
    /// Many connections, one call in flight each; `None` where they would not fit in memory
    /// ([`Results::many_skipped_above`]).
    pub many_connections: Option<Throughput>,
}

/// Registrations and imports per call of one kind of call, once warm.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RegistrationCost {
    /// Calls counted.
    pub calls: u64,
    /// Memory registrations per call.
    pub registrations_per_call: f64,
    /// Imports of a peer's memory per call.
    pub imports_per_call: f64,
}

/// The gRPC baseline at one payload size.
#[derive(Debug, Clone, Serialize)]
pub struct GrpcRow {
    /// Payload bytes.
    pub size: usize,
    /// Unary upload, one call in flight.
    pub upload: Latency,
    /// Unary download, one call in flight.
    pub download: Latency,
    /// Unary upload, several in flight on one channel.
    pub upload_throughput: Throughput,
    /// Unary download, several in flight on one channel.
    pub download_throughput: Throughput,
}

/// rdma-rpc over one transport, in the TLS comparison.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TransportFigures {
    /// 64 B sends, one in flight.
    pub send_64b: Latency,
    /// 4 MiB writes, several in flight on one connection.
    pub write_4mib: Throughput,
    /// 4 MiB reads, several in flight on one connection.
    pub read_4mib: Throughput,
}

/// rdma-rpc over `tls://` (with client certificates) next to `tcp://`, measured the same way
/// in the same run, on servers of their own.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TlsFigures {
    /// Over `tcp://`.
    pub tcp: TransportFigures,
    /// Over `tls://`.
    pub tls: TransportFigures,
}

impl TlsFigures {
    /// Lines of the table: each figure over both, and TLS's as a multiple of TCP's.
    fn table(&self, depth: usize, out: &mut String) {
        let _ = writeln!(
            out,
            "\nTLS: rdma-rpc over tls:// (TLS 1.3, client certificates) next to tcp://, same \
             run (throughput with {depth} in flight):"
        );
        let (tcp, tls) = (&self.tcp, &self.tls);
        let _ = writeln!(
            out,
            "  64 B send p50      tcp {:>8.1} us   tls {:>8.1} us   tls/tcp {}",
            tcp.send_64b.p50_us,
            tls.send_64b.p50_us,
            ratio(tls.send_64b.p50_us, tcp.send_64b.p50_us)
        );
        for (what, a, b) in [
            ("4 MiB write", tcp.write_4mib, tls.write_4mib),
            ("4 MiB read ", tcp.read_4mib, tls.read_4mib),
        ] {
            let _ = writeln!(
                out,
                "  {what} GB/s   tcp {:>8.3}      tls {:>8.3}      tls/tcp {}",
                a.gb_per_s,
                b.gb_per_s,
                ratio(b.gb_per_s, a.gb_per_s)
            );
        }
    }
}

/// A target from the issue, with the measured ratio.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The measured ratio (the figure itself for targets marked absolute).
    pub ratio: f64,
    /// The goal, as text (`<= 1.5`).
    pub goal: String,
    /// Whether it was met.
    pub met: bool,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// The machine the run was measured on.
    pub machine: super::machine::Machine,
    /// The rdma-rpc transport used.
    pub transport: String,
    /// How client and server sides were run.
    pub runtime: String,
    /// Whether this was a `--quick` run.
    pub quick: bool,
    /// Calls in flight per connection in the one-connection throughput runs.
    pub depth: usize,
    /// Connections in the many-connection runs.
    pub connections: usize,
    /// Payload sizes above this many bytes had no many-connection run: `connections` calls in
    /// flight of that size would not fit in half the memory available when the run started
    /// (`None`: every size ran).
    pub many_skipped_above: Option<usize>,
    /// Raw TCP 64-byte ping-pong round trip.
    pub tcp_round_trip: Latency,
    /// Raw TCP bulk stream of 4 MiB writes, GB/s.
    pub tcp_bulk_gb_per_s: f64,
    /// One thread copying 1 MiB buffers, over the working sets of the one-connection and the
    /// many-connection runs.
    pub copy: CopyRates,
    /// gRPC per payload size.
    pub grpc: Vec<GrpcRow>,
    /// rdma-rpc per operation and payload size.
    pub rows: Vec<OpRow>,
    /// Results landed in a caller's lease (`read_bytes_into`, 64 KiB to 16 MiB), once warm:
    /// registrations and imports per call (DOCA over the software provider only).
    pub read_into: Option<RegistrationCost>,
    /// Bulk and message streams (`None` in results of runs before streams).
    pub streams: Option<super::streams::StreamFigures>,
    /// rdma-rpc over `tls://` next to `tcp://` (`None` in results of runs before TLS).
    pub tls: Option<TlsFigures>,
    /// 64 B calls per second over 1, 64 and 1,000 DOCA connections (`None` in results of
    /// runs before it).
    pub doca_connections: Option<super::scale::ScaleFigures>,
    /// Peak resident memory of the whole run, MiB.
    pub peak_rss_mib: f64,
    /// The issue's targets.
    pub targets: Vec<Target>,
}

impl Results {
    fn grpc_at(&self, size: usize) -> Option<&GrpcRow> {
        self.grpc.iter().find(|g| g.size == size)
    }

    /// The gRPC figures an operation is compared with: upload for send and write, download
    /// for receive and read.
    fn grpc_for(&self, row: &OpRow) -> Option<(Latency, Throughput)> {
        let g = self.grpc_at(row.size)?;
        Some(match row.op {
            "send" | "write" => (g.upload, g.upload_throughput),
            _ => (g.download, g.download_throughput),
        })
    }

    /// The plain-text report.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "machine: {}", self.machine);
        let _ = writeln!(
            out,
            "baselines: raw TCP 64 B round trip p50 {:.1} us, p99 {:.1} us; raw TCP bulk (4 MiB writes) {:.2} GB/s",
            self.tcp_round_trip.p50_us, self.tcp_round_trip.p99_us, self.tcp_bulk_gb_per_s
        );
        let c = &self.copy;
        let _ = writeln!(
            out,
            "memory copy of 1 MiB buffers, one thread: among {} {:.1} GB/s, among {} {:.1} GB/s ({:.2}x: the bound of the {}-connection figures where moving bytes is a copy)",
            c.few_buffers,
            c.few_gb_per_s,
            c.many_buffers,
            c.many_gb_per_s,
            c.many_gb_per_s / c.few_gb_per_s.max(1e-9),
            c.many_buffers
        );
        let _ = writeln!(
            out,
            "rdma-rpc over {}; {}; throughput with {} calls in flight on one connection, and over {} connections\n",
            self.transport, self.runtime, self.depth, self.connections
        );
        let _ = writeln!(
            out,
            "{:<8} {:>7} {:>4} {:>5} {:>5} {:>9} {:>9} {:>8} {:>8} {:>9} {:>10} {:>8} {:>8} {:>9}",
            "op",
            "size",
            "RTs",
            "reg/c",
            "imp/c",
            "p50 us",
            "p99 us",
            "xTCP RT",
            "xgRPC",
            "GB/s 1c",
            "calls/s 1c",
            "xbulk",
            "xgRPC",
            "GB/s Nc"
        );
        let _ = writeln!(out, "{}", "-".repeat(124));
        for r in &self.rows {
            let grpc = self.grpc_for(r);
            let per_call = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
            let _ = writeln!(
                out,
                "{:<8} {:>7} {:>4.1} {:>5} {:>5} {:>9.1} {:>9.1} {:>8} {:>8} {:>9.3} {:>10.0} {:>8} {:>8} {:>9}",
                r.op,
                size(r.size),
                r.round_trips,
                per_call(r.registrations_per_call),
                per_call(r.imports_per_call),
                r.latency.p50_us,
                r.latency.p99_us,
                ratio(r.latency.p50_us, self.tcp_round_trip.p50_us),
                grpc.map_or("-".into(), |(l, _)| ratio(r.latency.p50_us, l.p50_us)),
                r.one_connection.gb_per_s,
                r.one_connection.calls_per_s,
                ratio(r.one_connection.gb_per_s, self.tcp_bulk_gb_per_s),
                grpc.map_or("-".into(), |(_, t)| ratio(r.one_connection.gb_per_s, t.gb_per_s)),
                r.many_connections.map_or("-".into(), |t| format!("{:.3}", t.gb_per_s)),
            );
        }
        if let Some(above) = self.many_skipped_above {
            let _ = writeln!(
                out,
                "\nGB/s Nc: not run above {} ({} calls in flight of that size would not fit in \
                 half the memory available at the start)",
                size(above),
                self.connections
            );
        }
        if let Some(c) = &self.read_into {
            let _ = writeln!(
                out,
                "\nreg/c, imp/c: memory registrations and imports per call once warm, both ends \
                 (DOCA's costly steps, counted by the software provider); results landed in a \
                 caller's lease (read_bytes_into, 64 KiB to 16 MiB): {:.2} and {:.2} over {} calls",
                c.registrations_per_call, c.imports_per_call, c.calls
            );
        }
        if let Some(st) = &self.streams {
            let one = |op: &str| {
                self.rows
                    .iter()
                    .find(|r| r.op == op && r.size == 4 << 20)
                    .map(|r| r.one_connection.gb_per_s)
            };
            let vs =
                |streamed: f64, op: &str| one(op).map_or("-".into(), |base| ratio(streamed, base));
            let _ = writeln!(
                out,
                "\nstreams, {} MiB through an endpoint of 4 MiB buffers, {} windows in flight (next \
                 to 4 MiB calls with {} in flight and raw TCP bulk, measured above):",
                st.object_bytes >> 20,
                self.depth,
                self.depth
            );
            for (what, gb, op) in [
                (
                    "write, from a region (in place)",
                    st.write_gb_per_s,
                    "write",
                ),
                (
                    "write, from plain bytes (staged)",
                    st.write_staged_gb_per_s,
                    "write",
                ),
                ("read, chunk by chunk", st.read_gb_per_s, "read"),
            ] {
                let _ = writeln!(
                    out,
                    "  {what:<34} {gb:>7.3} GB/s  {:>7} of 4 MiB {op} calls  {:>7} of raw TCP bulk",
                    vs(gb, op),
                    ratio(gb, self.tcp_bulk_gb_per_s)
                );
            }
            if let Some(calls) = st.calls_over_object_gb_per_s {
                let _ = writeln!(
                    out,
                    "  the same {} MiB as 4 MiB write calls, {} in flight, each from its own part \
                     of the object: {calls:.3} GB/s (the streamed write from a region is {} of \
                     it: the 4 MiB calls above reuse one cache-resident buffer)",
                    st.object_bytes >> 20,
                    self.depth,
                    ratio(st.write_gb_per_s, calls)
                );
            }
            let _ = writeln!(
                out,
                "  memory growth while streaming (server and client, one process): {:.0} MiB; \
                 the stream path's pool budget {:.0} MiB, client windows {:.0} MiB",
                st.rss_growth_mib, st.pool_budget_mib, st.client_windows_mib
            );
            let unary = self
                .rows
                .iter()
                .find(|r| r.op == "send" && r.size == 64)
                .map(|r| r.one_connection.calls_per_s);
            let _ = writeln!(
                out,
                "  {} messages of 64 B in one server stream: {:.0} messages/s ({} of 64 B send calls/s \
                 with {} in flight)",
                st.messages,
                st.messages_per_s,
                unary.map_or("-".into(), |u| ratio(st.messages_per_s, u)),
                self.depth
            );
        }
        if let Some(tls) = &self.tls {
            tls.table(self.depth, &mut out);
        }
        if let Some(scale) = &self.doca_connections {
            scale.table(&mut out);
        }
        let _ = writeln!(out, "\ngRPC (tonic) baseline:");
        let _ = writeln!(
            out,
            "{:>7} {:>13} {:>13} {:>15} {:>15}",
            "size", "upload p50", "download p50", "upload GB/s", "download GB/s"
        );
        for g in &self.grpc {
            let _ = writeln!(
                out,
                "{:>7} {:>10.1} us {:>10.1} us {:>15.3} {:>15.3}",
                size(g.size),
                g.upload.p50_us,
                g.download.p50_us,
                g.upload_throughput.gb_per_s,
                g.download_throughput.gb_per_s
            );
        }
        let _ = writeln!(out, "\ntargets (ratios measured in this run):");
        for t in &self.targets {
            let _ = writeln!(
                out,
                "  [{}] {:<60} {:>7.2}  (goal {})",
                if t.met { "met " } else { "MISS" },
                t.name,
                t.ratio,
                t.goal
            );
        }
        let _ = writeln!(
            out,
            "\npeak RSS of the whole run: {:.0} MiB",
            self.peak_rss_mib
        );
        out
    }

    /// The chart: p50 latency (log scale) and one-connection throughput against payload size.
    pub fn svg(&self) -> String {
        let series: Vec<Series<'_>> = {
            let mut s = Vec::new();
            for (op, color) in [
                ("send", "#1f77b4"),
                ("receive", "#2ca02c"),
                ("write", "#d62728"),
                ("read", "#9467bd"),
            ] {
                let points = self
                    .rows
                    .iter()
                    .filter(|r| r.op == op)
                    .map(|r| (r.size, r.latency.p50_us, r.one_connection.gb_per_s))
                    .collect();
                s.push((op, color, points));
            }
            let up = self
                .grpc
                .iter()
                .map(|g| (g.size, g.upload.p50_us, g.upload_throughput.gb_per_s))
                .collect();
            let down = self
                .grpc
                .iter()
                .map(|g| (g.size, g.download.p50_us, g.download_throughput.gb_per_s))
                .collect();
            s.push(("gRPC upload", "#ff7f0e", up));
            s.push(("gRPC download", "#8c564b", down));
            s
        };
        let sizes: Vec<usize> = self.rows.iter().map(|r| r.size).collect();
        let (xmin, xmax) = (
            sizes.iter().copied().min().unwrap_or(64).max(1) as f64,
            sizes.iter().copied().max().unwrap_or(1 << 24).max(2) as f64,
        );
        let lat_max = series
            .iter()
            .flat_map(|(_, _, p)| p.iter().map(|x| x.1))
            .fold(self.tcp_round_trip.p50_us, f64::max)
            .max(10.0);
        let lat_min = series
            .iter()
            .flat_map(|(_, _, p)| p.iter().map(|x| x.1))
            .fold(self.tcp_round_trip.p50_us, f64::min)
            .max(1.0);
        let tput_max = series
            .iter()
            .flat_map(|(_, _, p)| p.iter().map(|x| x.2))
            .fold(self.tcp_bulk_gb_per_s, f64::max)
            .max(0.01);

        let (w, h, pad) = (520.0, 360.0, 60.0);
        let x_of = |size: f64, left: f64| {
            left + pad
                + (size.ln() - xmin.ln()) / (xmax.ln() - xmin.ln()).max(1e-9) * (w - 2.0 * pad)
        };
        let lat_y = |us: f64| {
            h - pad
                - (us.ln() - lat_min.ln()) / (lat_max.ln() - lat_min.ln()).max(1e-9)
                    * (h - 2.0 * pad)
        };
        let tput_y = |gb: f64| h - pad - gb / tput_max * (h - 2.0 * pad);

        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">"#,
            2.0 * w,
            h + 60.0
        );
        let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
        for (panel, left, title) in [
            (0, 0.0, "p50 latency, one call in flight (us, log)"),
            (1, w, "throughput, one connection (GB/s)"),
        ] {
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="20" font-size="13" font-weight="bold">{title}</text>"#,
                left + pad
            );
            let _ = writeln!(
                svg,
                r##"<rect x="{}" y="{pad}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
                left + pad,
                w - 2.0 * pad,
                h - 2.0 * pad
            );
            for &s in &sizes {
                let x = x_of(s as f64, left);
                let _ = writeln!(
                    svg,
                    r#"<text x="{x}" y="{}" text-anchor="middle">{}</text>"#,
                    h - pad + 15.0,
                    size(s)
                );
            }
            let (label, y) = if panel == 0 {
                (
                    format!("raw TCP RT {:.0} us", self.tcp_round_trip.p50_us),
                    lat_y(self.tcp_round_trip.p50_us),
                )
            } else {
                (
                    format!("raw TCP bulk {:.2} GB/s", self.tcp_bulk_gb_per_s),
                    tput_y(self.tcp_bulk_gb_per_s),
                )
            };
            let _ = writeln!(
                svg,
                r##"<line x1="{}" x2="{}" y1="{y}" y2="{y}" stroke="#444" stroke-dasharray="4 3"/><text x="{}" y="{}">{label}</text>"##,
                left + pad,
                left + w - pad,
                left + pad + 4.0,
                y - 4.0
            );
            let (top, bottom) = if panel == 0 {
                (format!("{lat_max:.0} us"), format!("{lat_min:.0} us"))
            } else {
                (format!("{tput_max:.2}"), "0".to_string())
            };
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="end">{top}</text><text x="{}" y="{}" text-anchor="end">{bottom}</text>"#,
                left + pad - 4.0,
                pad + 4.0,
                left + pad - 4.0,
                h - pad
            );
            for (name, color, points) in &series {
                let path: Vec<String> = points
                    .iter()
                    .map(|&(s, lat, gb)| {
                        let y = if panel == 0 { lat_y(lat) } else { tput_y(gb) };
                        format!("{:.1},{:.1}", x_of(s as f64, left), y)
                    })
                    .collect();
                if path.is_empty() {
                    continue;
                }
                let dash = if name.starts_with("gRPC") {
                    r#" stroke-dasharray="6 3""#
                } else {
                    ""
                };
                let _ = writeln!(
                    svg,
                    r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}><title>{name}</title></polyline>"#,
                    path.join(" ")
                );
            }
        }
        for (i, (name, color, _)) in series.iter().enumerate() {
            let x = pad + i as f64 * 150.0;
            let _ = writeln!(
                svg,
                r#"<rect x="{x}" y="{}" width="14" height="4" fill="{color}"/><text x="{}" y="{}">{name}</text>"#,
                h + 20.0,
                x + 18.0,
                h + 25.0
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}
