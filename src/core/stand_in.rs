//! The stand-in engine's own options (`--sim-*`), which SGLang does not have. `pd-sim` parses
//! them; `validate` lets them through in a `sim` engine's extraArgs. One list for both.

/// `--sim-*` options that take a value.
pub const VALUE_OPTIONS: &[&str] = &[
    "--sim-page-size",
    "--sim-kv-cache-dtype",
    "--sim-hold-registrations",
    "--sim-bootstrap-server",
    "--sim-prefill-tokens-per-s",
    "--sim-itl-ms",
    "--sim-itl-ms-per-running",
    "--sim-kv-pool",
    "--sim-num-layers",
    "--sim-num-kv-heads",
    "--sim-head-dim",
    "--sim-kv-latent-dim",
    "--sim-transfer-gbps",
    "--sim-fault-die-mid-transfer",
];

/// `--sim-*` options that take no value.
pub const SWITCHES: &[&str] = &["--sim-fault-stall-transfers"];

/// Whether `arg` (`--flag` or `--flag=value`) is one of the stand-in's own options.
pub fn is_stand_in_option(arg: &str) -> bool {
    let flag = arg.split_once('=').map_or(arg, |(f, _)| f);
    SWITCHES.contains(&flag) || VALUE_OPTIONS.contains(&flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sim_options_are_the_stand_ins() {
        assert!(is_stand_in_option("--sim-page-size=16"));
        assert!(is_stand_in_option("--sim-fault-stall-transfers"));
        assert!(!is_stand_in_option("--page-size"));
        assert!(!is_stand_in_option("--sim-unknown"));
        assert!(VALUE_OPTIONS.iter().chain(SWITCHES).all(|o| o.starts_with("--sim-")));
    }
}
