//! Small and quick: the binary's size, the time from process start to its
//! first `getUpdates` against the fake Bot API, and the whole process's
//! resident memory while idle with 10,000 known sessions in its store.
//!
//! Everything is measured on the binary cargo built for this bench, and
//! the profile it was built with is printed beside each figure:
//! `cargo bench --bench footprint` measures the bench profile (the
//! `release` settings: parallel codegen, thin LTO, symbols kept);
//! `cargo bench --bench footprint --profile dist` measures what ships
//! (whole-program LTO, one codegen unit, stripped). Prints figures and
//! targets; asserts nothing (these machines are noisy).

#[path = "../tests/it/support/fake_bot/mod.rs"]
mod fake_bot;
#[path = "../tests/it/support/fake_files.rs"]
mod fake_files;
#[path = "support/figures.rs"]
mod figures;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fake_bot::FakeBotApi;
use figures::{figure, ms, Better};
use telegate::store::Store;

const SESSIONS: usize = 10_000;
const STARTS: usize = 7;
const START_TARGET: Duration = Duration::from_millis(50);
const RSS_TARGET_KB: u64 = 20 * 1024;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_telegate"))
}

/// The cargo profile the measured binary was built with: the name of the
/// directory it sits in (`target/<profile>/telegate`; `release` for the
/// bench profile, which writes there).
fn profile() -> String {
    binary()
        .parent()
        .and_then(Path::file_name)
        .map_or_else(|| "?".into(), |n| n.to_string_lossy().into_owned())
}

fn spawn(fake: &FakeBotApi, data_dir: &Path) -> Child {
    Command::new(binary())
        .arg("run")
        .current_dir(data_dir)
        .env_clear()
        .env("TELEGRAM_BOT_TOKEN", fake.token())
        .env("TELEGATE_API_URL", fake.url().to_string())
        .env("TELEGATE_ALLOWED_USERS", "42")
        .env("TELEGATE_DATA_DIR", data_dir)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("telegate starts")
}

fn stop(mut child: Child) {
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let _ = child.wait();
}

async fn until_polled(fake: &FakeBotApi, after: u64) -> bool {
    fake.wait_for(
        |calls| {
            calls
                .iter()
                .any(|c| c.seq >= after && c.method == "getUpdates")
        },
        Duration::from_secs(60),
    )
    .await
}

fn next_seq(fake: &FakeBotApi) -> u64 {
    fake.calls().last().map_or(0, |c| c.seq + 1)
}

/// A `/proc/<pid>/status` field in kB: `VmRSS` (the whole), `RssAnon`
/// (the heaps and stacks) or `RssFile` (the binary's and libraries' pages
/// read so far, shared with the page cache).
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| {
        l.strip_prefix(field)
            .is_some_and(|rest| rest.starts_with(':'))
    })?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn print_size() {
    let bin = binary();
    let Ok(bytes) = std::fs::read(&bin) else {
        println!("binary size: {} not readable", bin.display());
        return;
    };
    let mb = |n: u64| n as f64 / 1e6;
    // An ELF file names its sections; a stripped one has no `.symtab`.
    let has_symbols = bytes.windows(7).any(|w| w == b".symtab");
    println!(
        "binary size [profile {}]: {:.1} MB ({})  [{}]",
        profile(),
        mb(bytes.len() as u64),
        if has_symbols {
            "symbols kept"
        } else {
            "stripped"
        },
        bin.display()
    );
    figure(
        "footprint/binary_size",
        mb(bytes.len() as u64),
        "MB",
        Better::Lower,
        None,
    );
    if !has_symbols {
        return;
    }
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    let copy = dir.path().join("telegate-stripped");
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(&copy)
        .arg(&bin)
        .status()
        .is_ok_and(|s| s.success());
    match std::fs::metadata(&copy) {
        Ok(meta) if stripped => {
            println!(
                "binary size stripped [profile {}]: {:.1} MB (the dist profile adds whole-program LTO)",
                profile(),
                mb(meta.len())
            );
            figure(
                "footprint/binary_size_stripped",
                mb(meta.len()),
                "MB",
                Better::Lower,
                None,
            );
        }
        _ => println!("binary size stripped: `strip` not available"),
    }
}

async fn start_time() {
    let fake = FakeBotApi::start().await;
    let mut times = Vec::new();
    for _ in 0..STARTS {
        let dir = tempfile::tempdir().expect("tempdir");
        let after = next_seq(&fake);
        let started = Instant::now();
        let child = spawn(&fake, dir.path());
        let polled = until_polled(&fake, after).await;
        times.push(started.elapsed());
        stop(child);
        if !polled {
            println!("start: the bot never polled");
            return;
        }
        if times.len() == 1 {
            let before: Vec<String> = fake
                .calls()
                .iter()
                .filter(|c| c.seq >= after)
                .take_while(|c| c.method != "getUpdates")
                .map(|c| c.method.clone())
                .collect();
            println!(
                "Bot API calls before the first getUpdates: {}",
                before.join(", ")
            );
        }
    }
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "process start -> first getUpdates: median {:.1} ms over {STARTS} starts (min {:.1} ms)  target < {} ms",
        median.as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        START_TARGET.as_millis()
    );
    figure(
        "footprint/start_to_first_poll",
        ms(median),
        "ms",
        Better::Lower,
        Some(ms(START_TARGET)),
    );
}

async fn idle_rss() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_async(dir.path().join("telegate.db"))
        .await
        .expect("store");
    for i in 0..SESSIONS {
        let key = format!("agent:main:telegram:dm:{}", 1_000_000 + i);
        store
            .sessions()
            .get_or_create_session(&key, format!("s-{i}"))
            .await
            .expect("session");
    }
    store.close().await.expect("close");
    let fake = FakeBotApi::start().await;
    let child = spawn(&fake, dir.path());
    if !until_polled(&fake, 0).await {
        println!("rss: the bot never polled");
        stop(child);
        return;
    }
    // Idle: a few quiet long polls.
    tokio::time::sleep(Duration::from_secs(2)).await;
    match status_kb(child.id(), "VmRSS") {
        Some(kb) => {
            println!(
                "idle RSS with {SESSIONS} known sessions: {:.1} MB (whole process)  target < {} MB",
                kb as f64 / 1024.0,
                RSS_TARGET_KB / 1024
            );
            let part =
                |field| status_kb(child.id(), field).map_or(f64::NAN, |kb| kb as f64 / 1024.0);
            println!(
                "  of which heaps and stacks (RssAnon) {:.1} MB, pages of the binary and libraries (RssFile) {:.1} MB",
                part("RssAnon"),
                part("RssFile")
            );
            let target = Some(RSS_TARGET_KB as f64 / 1024.0);
            figure(
                "footprint/idle_rss",
                kb as f64 / 1024.0,
                "MB",
                Better::Lower,
                target,
            );
        }
        None => println!("idle RSS: /proc not readable here"),
    }
    stop(child);
}

fn main() {
    print_size();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(start_time());
    runtime.block_on(idle_rss());
}
