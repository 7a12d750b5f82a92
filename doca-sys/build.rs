//! Build script of doca-sys: chooses the provider (real DOCA SDK or the in-process software
//! provider) and, for the SDK, generates bindings from its headers.
//!
//! Search order (each variable is watched with `cargo:rerun-if-env-changed`):
//! 1. `DOCA_SYS_PROVIDER=sdk|software` forces a choice;
//! 2. `DOCA_DIR`, or `DOCA_INCLUDE_DIR` (+ `DOCA_LIB_DIR`);
//! 3. pkg-config modules `doca-rdma` + `doca-common`, then the umbrella module `doca`;
//! 4. the default prefix `/opt/mellanox/doca` (`include/`, `lib/<arch>-linux-gnu/`).
//!
//! Without the `sdk` feature no search happens: the software provider is used.

use std::env;
use std::path::PathBuf;

const ENV_VARS: &[&str] = &[
    "DOCA_SYS_PROVIDER",
    "DOCA_DIR",
    "DOCA_INCLUDE_DIR",
    "DOCA_LIB_DIR",
    "PKG_CONFIG_PATH",
    "PKG_CONFIG_LIBDIR",
    "PKG_CONFIG_SYSROOT_DIR",
];

/// Where the SDK was found.
#[cfg_attr(not(feature = "sdk"), allow(dead_code))]
#[derive(Debug)]
struct Sdk {
    /// How it was found, for messages.
    origin: String,
    include_dirs: Vec<PathBuf>,
    /// `None`: headers only (enough for `cargo check` and docs), no link directives.
    lib_dirs: Option<Vec<PathBuf>>,
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=include/doca_rpc_sw.h");
    for var in ENV_VARS {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo::rustc-check-cfg=cfg(doca_sys_software)");

    let forced = env::var("DOCA_SYS_PROVIDER").ok().filter(|v| !v.is_empty());
    match forced.as_deref() {
        Some("software") => use_software("DOCA_SYS_PROVIDER=software"),
        Some("sdk") => match find_sdk() {
            Ok(Some(sdk)) => use_sdk(sdk),
            Ok(None) => fail(
                "DOCA_SYS_PROVIDER=sdk but no DOCA SDK was found.\n\
                 Set DOCA_DIR to the SDK prefix (e.g. /opt/mellanox/doca), or DOCA_INCLUDE_DIR and \
                 DOCA_LIB_DIR, or make pkg-config find `doca-rdma` and `doca-common` (PKG_CONFIG_PATH), \
                 or unset DOCA_SYS_PROVIDER to use the software provider.",
            ),
            Err(msg) => fail(&msg),
        },
        Some(other) => fail(&format!(
            "DOCA_SYS_PROVIDER={other:?} is not valid: use `sdk` or `software`."
        )),
        None => match find_sdk() {
            Ok(Some(sdk)) => use_sdk(sdk),
            Ok(None) if cfg!(feature = "sdk") => use_software("no DOCA SDK found"),
            Ok(None) => use_software("the `sdk` feature is off"),
            Err(msg) => {
                if cfg!(feature = "sdk") {
                    fail(&msg)
                } else {
                    use_software("no DOCA SDK found")
                }
            }
        },
    }
}

fn fail(msg: &str) -> ! {
    panic!("doca-sys: {msg}");
}

fn use_software(reason: &str) {
    println!(
        "cargo:warning=doca-sys: using the in-process software provider ({reason}); \
         see doca-sys/README.md to build against a DOCA SDK"
    );
    println!("cargo:rustc-cfg=doca_sys_software");
    println!("cargo:provider=software");
}

/// Looks for the SDK. `Ok(None)`: not found; `Err`: found something inconsistent, or the `sdk`
/// feature is missing.
#[cfg(not(feature = "sdk"))]
fn find_sdk() -> Result<Option<Sdk>, String> {
    if env::var("DOCA_SYS_PROVIDER").as_deref() == Ok("sdk") {
        return Err(
            "DOCA_SYS_PROVIDER=sdk needs the cargo feature `sdk` of doca-sys \
                    (it enables bindgen; libclang must be installed). Then set DOCA_DIR, or \
                    DOCA_INCLUDE_DIR and DOCA_LIB_DIR, if the SDK is not under /opt/mellanox/doca."
                .to_owned(),
        );
    }
    Ok(None)
}

#[cfg(not(feature = "sdk"))]
fn use_sdk(_sdk: Sdk) {
    unreachable!("find_sdk never finds an SDK without the `sdk` feature")
}

#[cfg(feature = "sdk")]
fn find_sdk() -> Result<Option<Sdk>, String> {
    let var = |name: &str| {
        env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let arch_dir = format!(
        "{}-linux-gnu",
        env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".to_owned())
    );

    if let Some(dir) = var("DOCA_DIR") {
        let include = dir.join("include");
        if !include.join("doca_rdma.h").is_file() {
            return Err(format!(
                "DOCA_DIR={} has no include/doca_rdma.h; set DOCA_DIR to the SDK prefix, or \
                 DOCA_INCLUDE_DIR and DOCA_LIB_DIR",
                dir.display()
            ));
        }
        let lib = var("DOCA_LIB_DIR").unwrap_or_else(|| dir.join("lib").join(&arch_dir));
        return Ok(Some(Sdk {
            origin: format!("DOCA_DIR={}", dir.display()),
            include_dirs: vec![include],
            lib_dirs: Some(vec![lib]),
        }));
    }
    if let Some(include) = var("DOCA_INCLUDE_DIR") {
        if !include.join("doca_rdma.h").is_file() {
            return Err(format!(
                "DOCA_INCLUDE_DIR={} has no doca_rdma.h",
                include.display()
            ));
        }
        return Ok(Some(Sdk {
            origin: format!("DOCA_INCLUDE_DIR={}", include.display()),
            include_dirs: vec![include],
            lib_dirs: var("DOCA_LIB_DIR").map(|l| vec![l]),
        }));
    }
    if let Some(sdk) = probe_pkg_config() {
        return Ok(Some(sdk));
    }
    let prefix = PathBuf::from("/opt/mellanox/doca");
    if prefix.join("include/doca_rdma.h").is_file() {
        return Ok(Some(Sdk {
            origin: prefix.display().to_string(),
            include_dirs: vec![prefix.join("include")],
            lib_dirs: Some(vec![prefix.join("lib").join(arch_dir)]),
        }));
    }
    Ok(None)
}

#[cfg(feature = "sdk")]
fn probe_pkg_config() -> Option<Sdk> {
    let probe = |name: &str| {
        pkg_config::Config::new()
            .cargo_metadata(false)
            .env_metadata(false)
            .probe(name)
            .ok()
    };
    let libs = match (probe("doca-rdma"), probe("doca-common")) {
        (Some(rdma), Some(common)) => vec![rdma, common],
        _ => vec![probe("doca")?],
    };
    let mut include_dirs = Vec::new();
    let mut lib_dirs = Vec::new();
    for lib in &libs {
        include_dirs.extend(lib.include_paths.iter().cloned());
        lib_dirs.extend(lib.link_paths.iter().cloned());
    }
    Some(Sdk {
        origin: "pkg-config".to_owned(),
        include_dirs,
        lib_dirs: Some(lib_dirs),
    })
}

#[cfg(feature = "sdk")]
fn use_sdk(sdk: Sdk) {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let wrapper = out.join("doca_sys_wrapper.h");
    let headers = [
        "doca_error.h",
        "doca_dev.h",
        "doca_pe.h",
        "doca_ctx.h",
        "doca_mmap.h",
        "doca_buf.h",
        "doca_buf_inventory.h",
        "doca_rdma.h",
    ];
    let text: String = headers
        .iter()
        .map(|h| format!("#include <{h}>\n"))
        .collect();
    // Written only when it changes: bindgen's cargo callbacks make it an input of the build,
    // and a new timestamp would make every build rerun bindgen and rebuild the dependents.
    if std::fs::read_to_string(&wrapper).ok().as_deref() != Some(text.as_str()) {
        std::fs::write(&wrapper, text).expect("write the bindgen wrapper header");
    }

    let mut builder = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .clang_arg("-DDOCA_ALLOW_EXPERIMENTAL_API")
        .allowlist_item("doca_.*")
        .allowlist_item("DOCA_.*")
        .blocklist_function("doca_rdma_bridge_.*")
        .opaque_type("rdma_cm_id")
        .opaque_type("ibv_.*")
        .opaque_type("rdma_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for dir in &sdk.include_dirs {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    let bindings = builder.generate().unwrap_or_else(|e| {
        fail(&format!(
            "bindgen failed on the DOCA SDK headers found via {}: {e}",
            sdk.origin
        ))
    });
    bindings
        .write_to_file(out.join("bindings_sdk.rs"))
        .expect("write the SDK bindings");

    match &sdk.lib_dirs {
        Some(dirs) => {
            for dir in dirs {
                println!("cargo:rustc-link-search=native={}", dir.display());
            }
            println!("cargo:rustc-link-lib=doca_rdma");
            println!("cargo:rustc-link-lib=doca_common");
        }
        None => println!(
            "cargo:warning=doca-sys: DOCA_INCLUDE_DIR is set without DOCA_LIB_DIR: no link \
             directives are emitted (enough for `cargo check` and docs, not for linking)"
        ),
    }
    if let Some(dir) = sdk.include_dirs.first() {
        println!("cargo:include={}", dir.display());
    }
    println!("cargo:provider=sdk");
}
