use super::*;

fn berlin() -> TimeZone {
    TimeZone::get("Europe/Berlin").unwrap()
}

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// Friday 2026-05-01 12:00:00 in Berlin.
fn now() -> Timestamp {
    at("2026-05-01T10:00:00Z")
}

fn job(form: Form, args: &str) -> JobRequest {
    parse_job(form, args, now(), &berlin()).unwrap_or_else(|e| panic!("{args}: {e}"))
}

fn first_run(request: &JobRequest) -> Timestamp {
    request.schedule.next_after(now(), &berlin()).unwrap()
}

fn remind(text: &str) -> Action {
    Action::Message { text: text.into() }
}

#[test]
fn every_short_form_reads_as_its_schedule() {
    // (form, arguments, label, first run in UTC, action)
    let table: &[(Form, &str, &str, &str, Action)] = &[
        (
            Form::At,
            "18:00 remind: call Anna",
            "once",
            "2026-05-01T16:00:00Z",
            remind("call Anna"),
        ),
        (
            Form::At,
            "11:00 remind: x",
            "once",
            "2026-05-02T09:00:00Z",
            remind("x"),
        ),
        (
            Form::At,
            "tomorrow 9am remind: x",
            "once",
            "2026-05-02T07:00:00Z",
            remind("x"),
        ),
        (
            Form::At,
            "today 9:30pm remind: x",
            "once",
            "2026-05-01T19:30:00Z",
            remind("x"),
        ),
        (
            Form::At,
            "monday 08:15 remind: x",
            "once",
            "2026-05-04T06:15:00Z",
            remind("x"),
        ),
        (
            Form::At,
            "fri 08:00 remind: x",
            "once",
            "2026-05-08T06:00:00Z",
            remind("x"),
        ),
        (
            Form::At,
            "2026-12-24 18:00 remind: x",
            "once",
            "2026-12-24T17:00:00Z",
            remind("x"),
        ),
        (
            Form::At,
            "2026-12-24T18:00:30 remind: x",
            "once",
            "2026-12-24T17:00:30Z",
            remind("x"),
        ),
        (
            Form::In,
            "30m remind: call Anna",
            "once",
            "2026-05-01T10:30:00Z",
            remind("call Anna"),
        ),
        (
            Form::In,
            "2h30m remind: x",
            "once",
            "2026-05-01T12:30:00Z",
            remind("x"),
        ),
        (
            Form::In,
            "1h 30m remind: x",
            "once",
            "2026-05-01T11:30:00Z",
            remind("x"),
        ),
        (
            Form::In,
            "1 day remind: x",
            "once",
            "2026-05-02T10:00:00Z",
            remind("x"),
        ),
        (
            Form::In,
            "90s remind: x",
            "once",
            "2026-05-01T10:01:30Z",
            remind("x"),
        ),
        (
            Form::Every,
            "1h check the build",
            "every 1h",
            "2026-05-01T11:00:00Z",
            Action::Prompt {
                text: "check the build".into(),
                fresh: false,
            },
        ),
        (
            Form::Every,
            "90m x",
            "every 1h 30m",
            "2026-05-01T11:30:00Z",
            Action::Prompt {
                text: "x".into(),
                fresh: false,
            },
        ),
        (
            Form::Every,
            "2d remind: water the plants",
            "every 2 days at 12:00",
            "2026-05-03T10:00:00Z",
            remind("water the plants"),
        ),
        (
            Form::Every,
            "minute remind: x",
            "every minute",
            "2026-05-01T10:01:00Z",
            remind("x"),
        ),
        (
            Form::Every,
            "hour remind: x",
            "every hour",
            "2026-05-01T11:00:00Z",
            remind("x"),
        ),
        (
            Form::Every,
            "day 07:30 remind: x",
            "every day at 07:30",
            "2026-05-02T05:30:00Z",
            remind("x"),
        ),
        (
            Form::Every,
            "day at 18:00 remind: x",
            "every day at 18:00",
            "2026-05-01T16:00:00Z",
            remind("x"),
        ),
        (
            Form::Every,
            "weekday 08:00 fresh: summarise my inbox",
            "every weekday at 08:00",
            "2026-05-04T06:00:00Z",
            Action::Prompt {
                text: "summarise my inbox".into(),
                fresh: true,
            },
        ),
        (
            Form::Every,
            "weekend 10:00 remind: x",
            "every weekend day at 10:00",
            "2026-05-02T08:00:00Z",
            remind("x"),
        ),
        (
            Form::Every,
            "mon,wed,fri 18:30 remind: x",
            "every Mon, Wed, Fri at 18:30",
            "2026-05-01T16:30:00Z",
            remind("x"),
        ),
        (
            Form::Every,
            "sunday 9am remind: x",
            "every Sun at 09:00",
            "2026-05-03T07:00:00Z",
            remind("x"),
        ),
        (
            Form::Cron,
            "\"0 8 * * 1-5\" summarise",
            "cron 0 8 * * 1-5",
            "2026-05-04T06:00:00Z",
            Action::Prompt {
                text: "summarise".into(),
                fresh: false,
            },
        ),
        (
            Form::Cron,
            "0 8 * * 1-5 summarise",
            "cron 0 8 * * 1-5",
            "2026-05-04T06:00:00Z",
            Action::Prompt {
                text: "summarise".into(),
                fresh: false,
            },
        ),
        (
            Form::Cron,
            "'*/15 9-17 * * *' remind: x",
            "cron */15 9-17 * * *",
            "2026-05-01T10:15:00Z",
            remind("x"),
        ),
    ];
    for (form, args, label, first, action) in table {
        let request = job(*form, args);
        assert_eq!(request.label, *label, "{args}");
        assert_eq!(first_run(&request), at(first), "{args}");
        assert_eq!(&request.action, action, "{args}");
    }
}

#[test]
fn short_forms_compile_to_the_cron_expression_they_mean() {
    let cron = |form, args| match job(form, args).schedule {
        Schedule::Cron { expr } => expr,
        other => panic!("{args}: {other:?}"),
    };
    assert_eq!(cron(Form::Every, "weekday 08:00 x"), "0 8 * * 1-5");
    assert_eq!(cron(Form::Every, "weekend 10:00 x"), "0 10 * * 0,6");
    assert_eq!(cron(Form::Every, "fri,mon 18:30 x"), "30 18 * * 1,5");
    assert_eq!(cron(Form::Every, "day 7am x"), "0 7 * * *");
    assert_eq!(cron(Form::Every, "hour x"), "0 * * * *");
    assert_eq!(cron(Form::Every, "minute x"), "* * * * *");
}

#[test]
fn an_at_time_in_the_spring_forward_gap_runs_right_after_it() {
    let night = at("2026-03-28T22:00:00Z"); // 23:00 CET, the night the clocks go forward
    let request = parse_job(Form::At, "02:30 remind: x", night, &berlin()).unwrap();
    let first = request.schedule.next_after(night, &berlin()).unwrap();
    assert_eq!(first, at("2026-03-29T01:00:00Z")); // 03:00 CEST
}

#[test]
fn bad_requests_are_refused_in_words() {
    let refused = |form, args: &str| parse_job(form, args, now(), &berlin()).unwrap_err();
    assert!(refused(Form::At, "").starts_with("Usage: /at"));
    assert!(refused(Form::At, "2026-01-01 10:00 remind: x").contains("already passed"));
    assert!(refused(Form::At, "today 08:00 remind: x").contains("already passed"));
    assert!(refused(Form::At, "25:00 remind: x").contains("could not read a time"));
    assert!(refused(Form::At, "18:00").contains("What should happen"));
    assert!(refused(Form::At, "18:00 remind:").contains("Nothing after remind:"));
    assert!(refused(Form::In, "soon remind: x").contains("could not read a duration"));
    assert!(refused(Form::Every, "1d12h x").contains("not both"));
    assert!(refused(Form::Every, "1 month x").contains("/cron"));
    assert!(refused(Form::Every, "day x").contains("could not read a time"));
    assert!(refused(Form::Every, "fortnight x").contains("could not read"));
    assert!(refused(Form::Cron, "\"0 8 * *\" x").contains("five fields"));
    assert!(refused(Form::Cron, "\"0 8 * * 1-5 x").contains("closing quote"));
    assert!(refused(Form::Cron, "\"61 8 * * *\" x").contains("not valid"));
}

#[test]
fn a_when_alone_reads_the_same_forms() {
    let when = |text: &str| parse_when(text, now(), &berlin());
    let (schedule, label) = when("in 30m").unwrap();
    assert_eq!(
        (schedule, label.as_str()),
        (
            Schedule::Once {
                at: at("2026-05-01T10:30:00Z").as_second()
            },
            "once"
        )
    );
    assert_eq!(
        when("tomorrow 09:00").unwrap().0,
        Schedule::Once {
            at: at("2026-05-02T07:00:00Z").as_second()
        }
    );
    assert_eq!(
        when("at tomorrow 09:00").unwrap().0,
        when("tomorrow 09:00").unwrap().0
    );
    assert_eq!(
        when("every weekday 08:00").unwrap().1,
        "every weekday at 08:00"
    );
    assert_eq!(when("cron 0 8 * * 1-5").unwrap().1, "cron 0 8 * * 1-5");
    assert!(when("in 30m and then some")
        .unwrap_err()
        .contains("could not read"));
}

#[test]
fn actions_read_as_prompts_unless_marked() {
    assert_eq!(
        parse_action("REMIND: Call Anna").unwrap(),
        Action::Message {
            text: "Call Anna".into()
        }
    );
    assert_eq!(
        parse_action("remind me to call Anna").unwrap(),
        Action::Prompt {
            text: "remind me to call Anna".into(),
            fresh: false
        }
    );
    let long = Action::Prompt {
        text: "word ".repeat(40),
        fresh: true,
    };
    let summary = long.summary(20);
    assert!(summary.starts_with("fresh: word word"), "{summary}");
    assert!(summary.ends_with('…'), "{summary}");
}
