//! The deploy recipes stay valid: the systemd unit passes
//! `systemd-analyze verify` (when that tool exists; otherwise the test says
//! why it skipped) and keeps its promises; the Dockerfile and compose file
//! keep theirs (multi-stage, non-root, /data, HEALTHCHECK on /healthz, the
//! token as a file).

use std::path::Path;
use std::process::Command;

fn read(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy")
            .join(name),
    )
    .unwrap()
}

fn lines(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect()
}

#[test]
fn the_systemd_unit_keeps_its_promises() {
    let unit = read("telegate.service");
    let lines = lines(&unit);
    for needed in [
        "Type=notify",
        "WatchdogSec=60",
        "Restart=on-failure",
        "DynamicUser=yes",
        "StateDirectory=telegate",
        "LoadCredential=telegram_bot_token:/etc/telegate/telegram_bot_token",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=",
        // Stalled clients must hit the listeners' caps, not EMFILE.
        "LimitNOFILE=65536",
    ] {
        assert!(lines.contains(&needed), "{needed} missing from the unit");
    }
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let version = Command::new("systemd-analyze").arg("--version").output();
    if !version.as_ref().is_ok_and(|o| o.status.success()) {
        println!("SKIPPED: systemd-analyze is not available here ({version:?})");
        return;
    }
    // verify checks that ExecStart exists: point it at the built binary.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("telegate.service");
    let unit =
        read("telegate.service").replace("/usr/local/bin/telegate", env!("CARGO_BIN_EXE_telegate"));
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // verify exits 0 even for unknown keys or bad values; it only warns,
    // naming the file.
    let about_unit: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("telegate.service"))
        .collect();
    assert!(
        out.status.success() && about_unit.is_empty(),
        "systemd-analyze verify: {:?}\n{stderr}",
        out.status
    );
}

#[test]
fn the_dockerfile_is_multi_stage_non_root_with_data_and_healthcheck() {
    let dockerfile = read("Dockerfile");
    let lines = lines(&dockerfile);
    let froms = lines.iter().filter(|l| l.starts_with("FROM ")).count();
    assert!(froms >= 2, "multi-stage build");
    let user = lines
        .iter()
        .rev()
        .find(|l| l.starts_with("USER "))
        .expect("a USER line");
    assert!(!user.contains("root") && !user.ends_with(" 0"), "{user}");
    assert!(lines.contains(&"VOLUME [\"/data\"]"));
    assert!(dockerfile.contains("TELEGATE_DATA_DIR=/data"));
    let healthcheck = dockerfile
        .split("HEALTHCHECK")
        .nth(1)
        .expect("a HEALTHCHECK");
    assert!(healthcheck.contains("/healthz"));
    assert!(dockerfile.contains("TELEGATE_METRICS_LISTEN="));
    assert!(dockerfile.contains("--locked"));
}

#[test]
fn the_compose_example_passes_the_token_as_a_file() {
    let compose = read("compose.yaml");
    assert!(compose.contains("dockerfile: deploy/Dockerfile"));
    assert!(compose.contains("telegate-data:/data"));
    assert!(compose.contains("CREDENTIALS_DIRECTORY: /run/secrets"));
    assert!(compose.contains("- telegram_bot_token"));
    assert!(!compose.contains("TELEGRAM_BOT_TOKEN"));
}
