use super::*;
use proptest::prelude::*;

fn tz(name: &str) -> TimeZone {
    TimeZone::get(name).unwrap()
}

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn cron(expr: &str) -> Schedule {
    expr.parse().unwrap()
}

/// `(schedule, zone, after, expected next instants in UTC)`.
struct Case {
    what: &'static str,
    schedule: Schedule,
    zone: &'static str,
    after: &'static str,
    next: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    vec![
        // Europe/Berlin: 2026-03-29 02:00 -> 03:00, 2026-10-25 03:00 -> 02:00.
        Case {
            what: "a daily time skipped by spring-forward runs once right after the gap",
            schedule: cron("30 2 * * *"),
            zone: "Europe/Berlin",
            after: "2026-03-28T12:00:00Z",
            next: &[
                "2026-03-29T01:00:00Z", // 03:00 CEST, the first instant after the gap
                "2026-03-30T00:30:00Z", // 02:30 CEST
            ],
        },
        Case {
            what: "a daily time repeated by fall-back runs once, at the earlier instant",
            schedule: cron("30 2 * * *"),
            zone: "Europe/Berlin",
            after: "2026-10-24T12:00:00Z",
            next: &[
                "2026-10-25T00:30:00Z", // 02:30 CEST (not 02:30 CET an hour later)
                "2026-10-26T01:30:00Z", // 02:30 CET
            ],
        },
        Case {
            what: "a step job follows real time through the repeated hour",
            schedule: cron("*/30 * * * *"),
            zone: "Europe/Berlin",
            after: "2026-10-25T00:15:00Z",
            next: &[
                "2026-10-25T00:30:00Z", // 02:30 CEST
                "2026-10-25T01:00:00Z", // 02:00 CET
                "2026-10-25T01:30:00Z", // 02:30 CET
            ],
        },
        Case {
            what: "a step job skips the hour that does not exist",
            schedule: cron("*/30 * * * *"),
            zone: "Europe/Berlin",
            after: "2026-03-29T00:45:00Z", // 01:45 CET
            next: &["2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z"],
        },
        // America/New_York: 2026-03-08 02:00 -> 03:00, 2026-11-01 02:00 -> 01:00.
        Case {
            what: "a list of hours keeps the skipped one (after the gap), once",
            schedule: cron("0 2,14 * * *"),
            zone: "America/New_York",
            after: "2026-03-07T20:00:00Z",
            next: &[
                "2026-03-08T07:00:00Z", // 03:00 EDT
                "2026-03-08T18:00:00Z", // 14:00 EDT
                "2026-03-09T06:00:00Z", // 02:00 EDT
            ],
        },
        Case {
            what: "a list of hours runs a repeated time once",
            schedule: cron("30 1,13 * * *"),
            zone: "America/New_York",
            after: "2026-11-01T00:00:00Z",
            next: &[
                "2026-11-01T05:30:00Z", // 01:30 EDT
                "2026-11-01T18:30:00Z", // 13:30 EST
            ],
        },
        Case {
            what: "weekdays at 08:00 across the New York spring-forward weekend",
            schedule: cron("0 8 * * 1-5"),
            zone: "America/New_York",
            after: "2026-03-06T14:00:00Z", // Fri 09:00 EST
            next: &[
                "2026-03-09T12:00:00Z", // Mon 08:00 EDT
                "2026-03-10T12:00:00Z",
            ],
        },
        Case {
            what: "the 31st skips months without one",
            schedule: cron("0 9 31 * *"),
            zone: "UTC",
            after: "2026-03-31T10:00:00Z",
            next: &[
                "2026-05-31T09:00:00Z",
                "2026-07-31T09:00:00Z",
                "2026-08-31T09:00:00Z",
            ],
        },
        Case {
            what: "the last day of the month (L), February included",
            schedule: cron("0 18 L * *"),
            zone: "Europe/Berlin",
            after: "2026-01-31T18:00:00Z",
            next: &["2026-02-28T17:00:00Z", "2026-03-31T16:00:00Z"],
        },
        Case {
            what: "a leap day comes every four years",
            schedule: cron("0 12 29 2 *"),
            zone: "UTC",
            after: "2026-03-01T00:00:00Z",
            next: &["2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"],
        },
        Case {
            what: "every day at a time skipped by spring-forward (days form)",
            schedule: Schedule::Days {
                days: 1,
                anchor: "2026-03-28T02:30:00".into(),
            },
            zone: "Europe/Berlin",
            after: "2026-03-28T00:00:00Z",
            next: &[
                "2026-03-28T01:30:00Z", // 02:30 CET, the anchor
                "2026-03-29T01:00:00Z", // the gap: 03:00 CEST
                "2026-03-30T00:30:00Z", // 02:30 CEST
            ],
        },
        Case {
            what: "every two days keeps the local time over fall-back (days form)",
            schedule: Schedule::Days {
                days: 2,
                anchor: "2026-10-24T09:00:00".into(),
            },
            zone: "Europe/Berlin",
            after: "2026-10-24T07:00:00Z",
            next: &["2026-10-26T08:00:00Z", "2026-10-28T08:00:00Z"],
        },
        Case {
            what: "an hourly interval is real hours, DST or not",
            schedule: Schedule::Interval {
                every_secs: 3600,
                anchor: at("2026-10-24T23:00:00Z").as_second(),
            },
            zone: "Europe/Berlin",
            after: "2026-10-25T00:00:00Z",
            next: &["2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"],
        },
        Case {
            what: "a one-time job runs once",
            schedule: Schedule::Once {
                at: at("2026-12-24T17:00:00Z").as_second(),
            },
            zone: "Europe/Berlin",
            after: "2026-12-01T00:00:00Z",
            next: &["2026-12-24T17:00:00Z"],
        },
    ]
}

#[test]
fn next_runs_table() {
    for case in cases() {
        let zone = tz(case.zone);
        let mut after = at(case.after);
        for expected in case.next {
            let next = case
                .schedule
                .next_after(after, &zone)
                .unwrap_or_else(|| panic!("{}: no run after {after}", case.what));
            assert_eq!(next, at(expected), "{} (after {after})", case.what);
            after = next;
        }
        if let Schedule::Once { .. } = case.schedule {
            assert_eq!(
                case.schedule.next_after(after, &zone),
                None,
                "{}",
                case.what
            );
        }
    }
}

#[test]
fn local_times_resolve_like_cron() {
    let berlin = tz("Europe/Berlin");
    let skipped: DateTime = "2026-03-29T02:30:00".parse().unwrap();
    assert_eq!(
        resolve_local(&berlin, skipped),
        Some(at("2026-03-29T01:00:00Z"))
    );
    let repeated: DateTime = "2026-10-25T02:30:00".parse().unwrap();
    assert_eq!(
        resolve_local(&berlin, repeated),
        Some(at("2026-10-25T00:30:00Z"))
    );
    let plain: DateTime = "2026-06-01T12:00:00".parse().unwrap();
    assert_eq!(
        resolve_local(&berlin, plain),
        Some(at("2026-06-01T10:00:00Z"))
    );
}

#[test]
fn due_instants_are_counted_and_the_newest_kept() {
    let hourly = cron("0 * * * *");
    let due = hourly.due_until(
        at("2026-05-01T08:00:00Z"),
        at("2026-05-01T10:30:00Z"),
        &TimeZone::UTC,
        2,
    );
    assert_eq!(
        due.newest,
        vec![at("2026-05-01T09:00:00Z"), at("2026-05-01T10:00:00Z")]
    );
    assert_eq!((due.count, due.more), (3, false));
    let nothing = hourly.due_until(
        at("2026-05-01T11:00:00Z"),
        at("2026-05-01T10:30:00Z"),
        &TimeZone::UTC,
        2,
    );
    assert_eq!(nothing.count, 0);
}

#[test]
fn shortest_gaps_are_found() {
    let utc = TimeZone::UTC;
    let from = at("2026-05-01T00:00:00Z");
    let gap = |s: Schedule| s.shortest_gap(from, &utc).map(|d| d.as_secs());
    assert_eq!(gap(cron("* * * * *")), Some(60));
    assert_eq!(gap(cron("0 8,9 * * *")), Some(3600));
    assert_eq!(gap(cron("0 8 * * 1-5")), Some(86_400));
    assert_eq!(gap(Schedule::Once { at: 0 }), None);
    assert_eq!(
        gap(Schedule::Interval {
            every_secs: 30,
            anchor: 0
        }),
        Some(30)
    );
}

#[test]
fn bad_cron_expressions_are_refused() {
    assert_eq!(parse_cron("0 8 * *").unwrap_err(), CronRefusal::FieldCount);
    assert_eq!(
        parse_cron("0 0 8 * * *").unwrap_err(),
        CronRefusal::FieldCount
    );
    assert_eq!(parse_cron("@daily").unwrap_err(), CronRefusal::FieldCount);
    assert!(matches!(
        parse_cron("99 8 * * *"),
        Err(CronRefusal::Invalid(_))
    ));
    assert!(parse_cron("0 8 * * MON-FRI").is_ok());
}

const ZONES: &[&str] = &[
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Sydney",
    "Asia/Kolkata",
];

fn field(max: u32) -> impl Strategy<Value = String> {
    let single = (0..max).prop_map(|v| v.to_string());
    let list = (0..max, 0..max)
        .prop_filter("two values", |(a, b)| a != b)
        .prop_map(|(a, b)| format!("{},{}", a.min(b), a.max(b)));
    let range = (0..max, 0..max).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b)));
    let step = (1..max.min(30)).prop_map(|n| format!("*/{n}"));
    prop_oneof![Just("*".to_string()), single, list, range, step]
}

fn expression() -> impl Strategy<Value = String> {
    (
        field(60),
        field(24),
        prop_oneof![
            Just("*".to_string()),
            (1u32..29).prop_map(|d| d.to_string())
        ],
        prop_oneof![
            Just("*".to_string()),
            (1u32..13).prop_map(|m| m.to_string())
        ],
        prop_oneof![
            Just("*".to_string()),
            Just("1-5".to_string()),
            (0u32..7).prop_map(|d| d.to_string())
        ],
    )
        .prop_map(|(m, h, dom, mon, dow)| format!("{m} {h} {dom} {mon} {dow}"))
}

/// Whether a time zone transition lies in `(from, to]`.
fn transition_between(tz: &TimeZone, from: Timestamp, to: Timestamp) -> bool {
    tz.following(from)
        .next()
        .is_some_and(|t| t.timestamp() <= to)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Next runs strictly increase, and match croner's own answer wherever
    /// no DST transition lies between (in UTC: always).
    #[test]
    fn next_runs_increase_and_match_croner(
        expr in expression(),
        zone in 0..ZONES.len(),
        start in 1_767_225_600i64..1_893_456_000, // 2026..2030
    ) {
        let tz = tz(ZONES[zone]);
        let schedule = cron(&expr);
        let croner = parse_cron(&expr).unwrap();
        let mut after = Timestamp::from_second(start).unwrap();
        for _ in 0..12 {
            let Some(next) = schedule.next_after(after, &tz) else { break };
            prop_assert!(next > after, "{expr} in {}: {next} after {after}", ZONES[zone]);
            let theirs = croner
                .find_next_occurrence(&after.to_zoned(tz.clone()), false)
                .unwrap()
                .timestamp();
            if ZONES[zone] == "UTC" || !transition_between(&tz, after, theirs) {
                prop_assert_eq!(next, theirs, "{} in {} after {}", expr, ZONES[zone], after);
            }
            after = next;
        }
    }

    /// Intervals and day periods strictly increase too, and never drift.
    #[test]
    fn other_kinds_increase(
        every in 1i64..200_000,
        days in 1i32..10,
        zone in 0..ZONES.len(),
        start in 1_767_225_600i64..1_893_456_000,
    ) {
        let tz = tz(ZONES[zone]);
        let anchor = Timestamp::from_second(start).unwrap();
        let interval = Schedule::Interval { every_secs: every, anchor: start };
        let local = tz.to_datetime(anchor);
        let daily = Schedule::Days { days, anchor: local.to_string() };
        let mut after = anchor;
        for _ in 0..20 {
            let next = interval.next_after(after, &tz).unwrap();
            prop_assert!(next > after);
            prop_assert_eq!((next.as_second() - start) % every, 0);
            after = next;
        }
        let mut after = anchor.checked_sub(SignedDuration::from_secs(1)).unwrap();
        for _ in 0..20 {
            let next = daily.next_after(after, &tz).unwrap();
            prop_assert!(next > after);
            after = next;
        }
    }
}
