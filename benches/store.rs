//! Store benchmark: what the SQLite store costs per message and per turn.
//!
//! Runs against a file database in a temp dir (WAL, `synchronous=NORMAL`,
//! exactly as in production) through the async API, so every figure
//! includes the round trip to the store thread. Prints a table; asserts
//! nothing about timing (machines differ).
//!
//! `cargo bench --bench store`

use std::time::{Duration, Instant};

#[path = "support/allocator.rs"]
mod allocator;
#[path = "support/figures.rs"]
mod figures;

use figures::{figure, Better};
use telegate::store::{Store, TranscriptEntry};

const SINGLE_APPENDS: usize = 10_000;
const BATCH: usize = 100;
const BATCHED_APPENDS: usize = 10_000;
const HISTORY_SIZE: usize = 1_000;
const HISTORY_WINDOW: usize = 50;
const LOADS: usize = 5_000;
const TURNS: usize = 2_000;
const CONCURRENT_TASKS: usize = 16;

/// A message about the size of a typical chat turn.
fn message(i: usize) -> String {
    format!(
        "message {i}: {}",
        "the quick brown fox jumps over the lazy dog; ".repeat(4)
    )
}

/// One row of the printed table.
struct Figure {
    name: &'static str,
    ops: usize,
    unit: &'static str,
    took: Duration,
}

impl Figure {
    fn print(&self) {
        let secs = self.took.as_secs_f64();
        let per_op_us = secs * 1e6 / self.ops as f64;
        let rate = self.ops as f64 / secs;
        println!(
            "| {:<44} | {:>6} | {:>9.1} ms | {:>10.0} {:<9} | {:>9.1} µs |",
            self.name,
            self.ops,
            secs * 1e3,
            rate,
            format!("{}/s", self.unit),
            per_op_us
        );
        let slug: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        let slug = slug
            .split('_')
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join("_");
        figure(
            &format!("store/{slug}"),
            per_op_us,
            "us",
            Better::Lower,
            None,
        );
    }
}

async fn single_appends(store: &Store) -> Figure {
    let started = Instant::now();
    for i in 0..SINGLE_APPENDS {
        store
            .transcripts()
            .append("bench-single", TranscriptEntry::user(message(i)))
            .await
            .expect("append");
    }
    Figure {
        name: "append, one at a time (1 task)",
        ops: SINGLE_APPENDS,
        unit: "msg",
        took: started.elapsed(),
    }
}

async fn concurrent_appends(store: &Store) -> Figure {
    let per_task = SINGLE_APPENDS / CONCURRENT_TASKS;
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENT_TASKS)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let session = format!("bench-concurrent-{t}");
                for i in 0..per_task {
                    store
                        .transcripts()
                        .append(&session, TranscriptEntry::user(message(i)))
                        .await
                        .expect("append");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    Figure {
        name: "append, one at a time (16 tasks)",
        ops: per_task * CONCURRENT_TASKS,
        unit: "msg",
        took: started.elapsed(),
    }
}

async fn batched_appends(store: &Store) -> Figure {
    let started = Instant::now();
    for b in 0..BATCHED_APPENDS / BATCH {
        let batch = (0..BATCH)
            .map(|i| TranscriptEntry::user(message(b * BATCH + i)))
            .collect();
        store
            .transcripts()
            .append_many("bench-batched", batch)
            .await
            .expect("append_many");
    }
    Figure {
        name: "append_many, batches of 100",
        ops: BATCHED_APPENDS,
        unit: "msg",
        took: started.elapsed(),
    }
}

async fn history_loads(store: &Store) -> Figure {
    let batch = (0..HISTORY_SIZE)
        .map(|i| TranscriptEntry::user(message(i)))
        .collect();
    store
        .transcripts()
        .append_many("bench-history", batch)
        .await
        .expect("seed history");
    let started = Instant::now();
    for _ in 0..LOADS {
        let h = store
            .transcripts()
            .load_history("bench-history", Some(HISTORY_WINDOW))
            .await
            .expect("load_history");
        assert_eq!(
            h.len(),
            HISTORY_WINDOW,
            "benchmark is measuring the wrong thing"
        );
    }
    Figure {
        name: "load_history(last 50 of 1,000)",
        ops: LOADS,
        unit: "load",
        took: started.elapsed(),
    }
}

async fn turns(store: &Store) -> Figure {
    let session = store
        .sessions()
        .get_or_create_session("bench-chat", "bench-turns".into())
        .await
        .expect("session");
    let id = session.session_id;
    let started = Instant::now();
    for i in 0..TURNS {
        store.sessions().touch("bench-chat").await.expect("touch");
        store
            .transcripts()
            .append(&id, TranscriptEntry::user(message(i)))
            .await
            .expect("append user");
        store
            .transcripts()
            .load_history(&id, Some(HISTORY_WINDOW))
            .await
            .expect("load");
        store
            .transcripts()
            .append(&id, TranscriptEntry::assistant(message(i)))
            .await
            .expect("append assistant");
    }
    Figure {
        name: "turn: touch + append + load(50) + append",
        ops: TURNS,
        unit: "turn",
        took: started.elapsed(),
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("bench.db");
        let store = Store::open_async(&path).await.expect("open store");

        let figures = [
            single_appends(&store).await,
            concurrent_appends(&store).await,
            batched_appends(&store).await,
            history_loads(&store).await,
            turns(&store).await,
        ];

        println!();
        println!("store benchmark: file DB in a temp dir, WAL, synchronous=NORMAL, async API");
        println!(
            "| {:<44} | {:>6} | {:>12} | {:>20} | {:>12} |",
            "what", "ops", "total", "rate", "per op"
        );
        println!(
            "|{}|{}|{}|{}|{}|",
            "-".repeat(46),
            "-".repeat(8),
            "-".repeat(14),
            "-".repeat(22),
            "-".repeat(14)
        );
        for f in &figures {
            f.print();
        }
        store.close().await.expect("close store");
    });
}
