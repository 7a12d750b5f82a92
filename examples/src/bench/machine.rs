//! What machine a run was measured on, printed at the top of the benchmark's and the storage
//! demo's reports: figures of record are compared across sessions, and a session's machine is
//! not always the last one's (the same code made a fifth more `callcost` calls per second on
//! the 2-core VM of one session than on that of the one before). Read from Linux's `/proc`;
//! elsewhere only the CPU count is known.

use std::fmt;

use serde::Serialize;

/// The CPU, its count, the memory, and whether a hypervisor runs the machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Machine {
    /// The CPU's model name (`/proc/cpuinfo`), or `None` where it is not known.
    pub cpu: Option<String>,
    /// Logical CPUs this process may run on.
    pub cpus: usize,
    /// Memory of the machine, GiB (`MemTotal`), or `None` where it is not known.
    pub memory_gib: Option<f64>,
    /// Whether the CPU reports a hypervisor (its `hypervisor` flag): a virtual machine, where
    /// wake-ups and page walks cost more than on bare metal.
    pub virtual_machine: bool,
}

impl Machine {
    /// This machine.
    pub fn this() -> Machine {
        let read = |path| std::fs::read_to_string(path).unwrap_or_default();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Machine::parse(&read("/proc/cpuinfo"), &read("/proc/meminfo"), cpus)
    }

    /// The machine `/proc/cpuinfo` and `/proc/meminfo` describe (either may be empty).
    pub fn parse(cpuinfo: &str, meminfo: &str, cpus: usize) -> Machine {
        let field = |name: &str| {
            cpuinfo.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == name).then(|| value.trim().to_string())
            })
        };
        let memory_kib = super::measure::meminfo_kib(meminfo, "MemTotal");
        Machine {
            cpu: field("model name").filter(|name| !name.is_empty()),
            cpus,
            memory_gib: memory_kib.map(|kib| kib as f64 / (1024.0 * 1024.0)),
            virtual_machine: field("flags")
                .is_some_and(|flags| flags.split_whitespace().any(|f| f == "hypervisor")),
        }
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cpu = self.cpu.as_deref().unwrap_or("an unknown CPU");
        let s = if self.cpus == 1 { "" } else { "s" };
        write!(f, "{cpu}, {} CPU{s}", self.cpus)?;
        if let Some(gib) = self.memory_gib {
            write!(f, ", {gib:.0} GiB")?;
        }
        if self.virtual_machine {
            write!(f, ", a virtual machine")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Machine;

    const CPUINFO: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n\
        flags\t\t: fpu vme sse2 hypervisor lahf_lm\n\nprocessor\t: 1\nmodel name\t: AMD EPYC\n";
    const MEMINFO: &str = "MemTotal:       24576000 kB\nMemFree:        23000000 kB\n";

    #[test]
    fn a_virtual_machine_is_described_from_proc() {
        let m = Machine::parse(CPUINFO, MEMINFO, 2);
        assert_eq!(m.cpu.as_deref(), Some("AMD EPYC"));
        assert!(m.virtual_machine);
        assert_eq!(m.to_string(), "AMD EPYC, 2 CPUs, 23 GiB, a virtual machine");
    }

    #[test]
    fn bare_metal_and_missing_files_say_what_is_known() {
        let bare = CPUINFO.replace(" hypervisor", "");
        let m = Machine::parse(&bare, "", 1);
        assert!(!m.virtual_machine);
        assert_eq!(m.to_string(), "AMD EPYC, 1 CPU");
        // A flag that only contains the word is not the flag.
        let lookalike = CPUINFO.replace(" hypervisor", " nohypervisor");
        assert!(!Machine::parse(&lookalike, "", 1).virtual_machine);
        assert_eq!(
            Machine::parse("", "", 4).to_string(),
            "an unknown CPU, 4 CPUs"
        );
    }
}
