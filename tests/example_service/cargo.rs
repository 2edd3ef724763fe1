//! Running cargo from inside a process that cargo started (a test, the bench).

/// `cargo` as a person at the shell runs it: without the variables cargo set for this
/// process (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, …). Some build scripts (ring's, under
/// the `nats` feature) rerun when those change, so a build under them would rebuild
/// orderly, and the next plain cargo command would rebuild it back.
pub fn plain_cargo() -> std::process::Command {
    let mut cargo =
        std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (name, _) in std::env::vars_os() {
        let set_by_cargo = name
            .to_str()
            .is_some_and(|n| SET_BY_CARGO.iter().any(|prefix| n.starts_with(prefix)));
        if set_by_cargo {
            cargo.env_remove(name);
        }
    }
    cargo
}

/// The variables cargo sets for a crate it runs (names, or the start of names).
const SET_BY_CARGO: [&str; 7] = [
    "CARGO_PKG_",
    "CARGO_MANIFEST_",
    "CARGO_BIN_",
    "CARGO_CRATE_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "OUT_DIR",
];
