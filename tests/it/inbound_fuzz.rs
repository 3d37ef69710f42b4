//! Fuzz-style property test of the inbound path: malformed and hostile
//! updates go through [`Intake::take`] (what the `getUpdates` loop and the
//! webhook call with each raw update) of a real bot running against the fake
//! Bot API, with the echo agent answering.
//!
//! Each case is a handful of updates built from random parts: missing
//! fields, fields of the wrong type, unknown fields, huge texts (100 KB and
//! more), entities with invalid or out-of-range offsets (including ones that
//! split a surrogate pair), astral, zero-width, right-to-left and NUL
//! characters, deep nesting (up to the JSON parser's limit), zero, negative
//! and huge ids, commands for other bots, messages from bots, edited
//! messages, channel posts, callback queries, inline queries, unknown update
//! kinds, redeliveries. Proven for every case:
//!
//! * nothing panics (`take` runs in a spawned task, as in the bot);
//! * `take` never fails on content (only a store failure may fail it);
//! * an update without an integer `update_id` is ignored; every other one
//!   has an inbox row; an ignored one is `dropped` with a reason; a
//!   redelivered id is recognised; update kinds other than `message` are
//!   never accepted, a well-formed message from an allowed user always is;
//! * every accepted message ends `answered`, `failed` or `dropped`;
//! * the bot keeps serving: a normal message sent through the fake's
//!   `getUpdates` afterwards gets its answer.
//!
//! A fixed corpus (one update of every hostile kind) runs first, then 128
//! random cases of 1 to 7 updates (a new seed each run; failures are kept in
//! `inbound_fuzz.proptest-regressions`). What was covered is printed
//! (`--nocapture`). It found two crashes, now fixed: a mention entity that
//! does not fit the text panicked in teloxide's `parse_entities` (killing
//! the `getUpdates` task), and a dozen nested `reply_to_message` overflowed
//! the stack inside teloxide's deserializer (aborting the process).

use crate::support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestRunner};
use serde_json::{json, Map, Value};
use support::fake_bot::FakeBotApi;
use support::test_bot::TestBot;
use telegate::agent::EchoAgent;
use telegate::transport::telegram::callback::CallbackHandler;
use telegate::transport::telegram::inbound::InboundPolicy;
use telegate::transport::telegram::intake::{Intake, Intook};
use telegate::transport::telegram::TelegramBot;
use telegate::vocab::{parse_command, InboxState};
use tokio::runtime::Runtime;

/// Users on the allowlist.
const ALLOWED: u64 = 42;
/// The chat (and user) that proves the bot still serves; never fuzzed.
const PING: i64 = 777;
const BOT_ID: u64 = 123;
const BOT_USERNAME: &str = "telegate_test_bot";
/// Fresh update ids start here, far above the fake's own ids (1, 2, …) and
/// below `i32::MAX`.
const FRESH_IDS: i64 = 1_000_000_000;
/// How long accepted messages and the ping may take.
const SETTLE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// The bot, shared by all cases (the process must keep serving across them)
// ---------------------------------------------------------------------------

/// What the cases covered (printed at the end).
#[derive(Clone, Debug, Default)]
struct Stats {
    updates: usize,
    without_id: usize,
    /// Built too deep for the JSON parser: cannot reach the intake.
    unparseable: usize,
    duplicates: usize,
    accepted: usize,
    /// Ignored updates by the recorded reason.
    ignored: BTreeMap<String, usize>,
    /// How accepted messages ended.
    outcomes: BTreeMap<&'static str, usize>,
    huge_accepted: usize,
    /// Updates nested more than 8 levels deep.
    deep: usize,
}

struct Harness {
    stats: Mutex<Stats>,
    runtime: Runtime,
    fake: FakeBotApi,
    bot: TelegramBot,
    intake: Intake,
    /// The same intake with the bot's button handler, as the bot runs it.
    intake_with_buttons: Intake,
    next_id: AtomicI64,
    /// Update ids already taken: taking one again is a redelivery.
    seen: Mutex<HashSet<i64>>,
    pings: AtomicI64,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let (fake, bot) = runtime.block_on(async {
            let fake = FakeBotApi::start().await;
            let bot = TestBot::new(&fake)
                .users(&[ALLOWED as i64, PING])
                .toml(
                    "[delivery]\nper_chat_interval_ms = 1\ngroup_messages_per_minute = 1000000\n\
                     global_messages_per_second = 1000000\nedit_interval_ms = 50\n\n\
                     [sessions]\nstall_timeout_secs = 5\n\n[store]\nin_memory = true\n",
                )
                .agent(Arc::new(EchoAgent::default()))
                .start()
                .await
                .expect("the bot starts against the fake");
            (fake, bot)
        });
        // The same policy the bot derives from the config and `getMe`.
        let policy = InboundPolicy {
            bot_id: BOT_ID,
            bot_username: Arc::from(BOT_USERNAME),
            allowed_users: vec![ALLOWED, PING as u64],
            allowed_chats: vec![],
            allow_all_users: false,
            require_mention: true,
            access: None,
        };
        let intake = Intake::new(
            bot.engine.clone(),
            bot.delivery.clone(),
            telegate::wiring::tables::transport(&bot.store),
            policy,
            true,
            bot.metrics.clone(),
        );
        let intake_with_buttons = intake.clone().with_callbacks(Arc::new(CallbackHandler::new(
            bot.engine.clone(),
            bot.delivery.clone(),
            telegate::wiring::tables::transport(&bot.store),
            vec![],
        )));
        Harness {
            stats: Mutex::default(),
            runtime,
            fake,
            bot,
            intake,
            intake_with_buttons,
            next_id: AtomicI64::new(FRESH_IDS),
            seen: Mutex::new(HashSet::new()),
            pings: AtomicI64::new(0),
        }
    })
}

// ---------------------------------------------------------------------------
// What an update is made of
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum IdSpec {
    Fresh,
    Zero,
    Negative,
    I32Max,
    AboveU32,
    I64Max,
    /// The id of an earlier update of the case (a redelivery).
    Repeat,
    Missing,
    /// Not an integer: a string, a float, null, a huge unsigned, an object.
    NotAnInteger(Value),
}

#[derive(Clone, Debug)]
enum KindSpec {
    Message,
    EditedMessage,
    ChannelPost,
    EditedChannelPost,
    BusinessMessage,
    CallbackQuery,
    InlineQuery,
    MyChatMember,
    Unknown(String),
    /// No kind field at all.
    None,
    /// A message and a callback query in one update.
    Two,
}

#[derive(Clone, Debug)]
enum ChatSpec {
    Private { allowed: bool },
    Group,
    Supergroup,
    Forum,
    Channel,
    Id(Value),
    BogusType,
}

#[derive(Clone, Debug)]
enum FromSpec {
    Allowed,
    Stranger,
    Bot,
    Missing,
    Id(Value),
}

#[derive(Clone, Debug)]
enum TextSpec {
    Words(String),
    Command(&'static str),
    Mentioned(String),
    /// `count` copies of `atom` (100 KB and more).
    Huge {
        atom: &'static str,
        count: usize,
    },
    Missing,
    WrongType(Value),
}

#[derive(Clone, Debug)]
struct EntitySpec {
    kind: &'static str,
    offset: Value,
    length: Value,
}

#[derive(Clone, Debug)]
enum Mutation {
    /// Remove the n-th key (of the sorted keys) of the message.
    Remove(usize),
    /// Give the n-th key a value of another type.
    Retype(usize, Value),
    /// An unknown field nested `depth` arrays deep.
    Nested(usize),
    /// A `reply_to_message` chain `depth` messages deep.
    ReplyChain(usize),
    Unknown(String, Value),
}

#[derive(Clone, Debug)]
struct UpdateSpec {
    id: IdSpec,
    kind: KindSpec,
    chat: ChatSpec,
    from: FromSpec,
    message_id: Value,
    text: TextSpec,
    entities: Vec<EntitySpec>,
    photo: bool,
    reply_to_bot: bool,
    topic: bool,
    mutations: Vec<Mutation>,
}

impl UpdateSpec {
    /// True when the bot must accept it: a well-formed message with a valid
    /// id from an allowed user in a private chat, not a command for another
    /// bot.
    fn must_be_accepted(&self) -> bool {
        let text = match text_value(&self.text) {
            Some(Value::String(text)) => text,
            _ => return false,
        };
        let for_another_bot = parse_command(&text, None).is_some()
            && parse_command(&text, Some(BOT_USERNAME)).is_none();
        // teloxide reads update ids as u32: others are malformed.
        matches!(self.id, IdSpec::Fresh | IdSpec::Zero | IdSpec::I32Max)
            && matches!(self.kind, KindSpec::Message)
            && matches!(self.chat, ChatSpec::Private { allowed: true })
            && matches!(self.from, FromSpec::Allowed)
            && self
                .message_id
                .as_i64()
                .is_some_and(|id| id > 0 && id < 1 << 30)
            && !for_another_bot
            && self.entities.is_empty()
            && self.mutations.is_empty()
    }

    /// True when the bot must not accept it, whatever its content: update
    /// kinds other than `message`.
    fn must_be_ignored(&self) -> bool {
        !matches!(self.kind, KindSpec::Message | KindSpec::Two)
    }
}

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

fn wrong_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(json!(true)),
        Just(json!("x")),
        Just(json!(-1)),
        Just(json!(1.5)),
        Just(json!(u64::MAX)),
        Just(json!([1, "a", null])),
        Just(json!({"id": "no"})),
    ]
}

fn id_spec() -> impl Strategy<Value = IdSpec> {
    prop_oneof![
        16 => Just(IdSpec::Fresh),
        1 => Just(IdSpec::Zero),
        1 => Just(IdSpec::Negative),
        1 => Just(IdSpec::I32Max),
        1 => Just(IdSpec::AboveU32),
        1 => Just(IdSpec::I64Max),
        2 => Just(IdSpec::Repeat),
        1 => Just(IdSpec::Missing),
        1 => wrong_value().prop_map(IdSpec::NotAnInteger),
    ]
}

fn kind_spec() -> impl Strategy<Value = KindSpec> {
    prop_oneof![
        24 => Just(KindSpec::Message),
        2 => Just(KindSpec::EditedMessage),
        1 => Just(KindSpec::ChannelPost),
        1 => Just(KindSpec::EditedChannelPost),
        1 => Just(KindSpec::BusinessMessage),
        2 => Just(KindSpec::CallbackQuery),
        1 => Just(KindSpec::InlineQuery),
        1 => Just(KindSpec::MyChatMember),
        1 => "[a-z_]{1,20}".prop_map(KindSpec::Unknown),
        1 => Just(KindSpec::None),
        1 => Just(KindSpec::Two),
    ]
}

fn chat_spec() -> impl Strategy<Value = ChatSpec> {
    prop_oneof![
        10 => Just(ChatSpec::Private { allowed: true }),
        1 => Just(ChatSpec::Private { allowed: false }),
        3 => Just(ChatSpec::Group),
        2 => Just(ChatSpec::Supergroup),
        1 => Just(ChatSpec::Forum),
        1 => Just(ChatSpec::Channel),
        1 => prop_oneof![
            Just(json!(0)),
            Just(json!(i64::MAX)),
            Just(json!(i64::MIN)),
            wrong_value(),
        ]
        .prop_map(ChatSpec::Id),
        1 => Just(ChatSpec::BogusType),
    ]
}

fn from_spec() -> impl Strategy<Value = FromSpec> {
    prop_oneof![
        12 => Just(FromSpec::Allowed),
        2 => Just(FromSpec::Stranger),
        1 => Just(FromSpec::Bot),
        1 => Just(FromSpec::Missing),
        1 => prop_oneof![Just(json!(0)), Just(json!(-5)), Just(json!(u64::MAX)), wrong_value()]
            .prop_map(FromSpec::Id),
    ]
}

/// Pieces that stress rendering, splitting and UTF-16 arithmetic.
const ATOMS: &[&str] = &[
    "hello",
    " ",
    "\n",
    "😀",
    "👩‍👩‍👧‍👦",
    "🇩🇪",
    "e\u{301}",
    "\u{202E}",
    "\u{200B}",
    "\u{FEFF}",
    "\u{0}",
    "\u{FFFF}",
    "\u{10FFFF}",
    "**",
    "_",
    "`",
    "```",
    "[",
    "](",
    "http://x",
    "#",
    ">",
    "|",
    "\\",
    "<b>",
    "&amp;",
    "@",
    "/",
    "@telegate_test_bot",
    "𝕏",
    "ﷺ",
    "\t",
    "\r\n",
];

fn words() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(ATOMS), 0..24).prop_map(|atoms| atoms.concat())
}

fn text_spec() -> impl Strategy<Value = TextSpec> {
    prop_oneof![
        8 => words().prop_map(TextSpec::Words),
        2 => prop::sample::select(vec![
            "/start", "/help", "/status", "/stop", "/new", "/reset", "/nosuch",
            "/status@telegate_test_bot", "/stop@other_bot", "/help@other_bot", "/", "/@", "/stop@",
            "@telegate_test_bot /status", "/ünïcode", "/stop@telegate_test_bot@x",
        ])
        .prop_map(TextSpec::Command),
        2 => words().prop_map(TextSpec::Mentioned),
        1 => (prop::sample::select(vec!["a", "😀", "**b** ", "👩‍👩‍👧‍👦", "`x` ", "[l](http://x) "]), 0..3usize)
            .prop_map(|(atom, extra)| {
                let count = (100 * 1024 + extra * 20 * 1024) / atom.len();
                TextSpec::Huge { atom, count }
            }),
        1 => Just(TextSpec::Missing),
        1 => wrong_value().prop_map(TextSpec::WrongType),
    ]
}

fn entity_spec() -> impl Strategy<Value = EntitySpec> {
    let kind = prop::sample::select(vec![
        "mention",
        "bot_command",
        "bold",
        "text_mention",
        "text_link",
        "custom_emoji",
        "nonsense",
    ]);
    let number = prop_oneof![
        12 => (0i64..40).prop_map(|n| json!(n)),
        1 => Just(json!(-1)),
        1 => Just(json!(u32::MAX)),
        1 => Just(json!(u64::MAX)),
        1 => Just(json!(i64::MAX)),
        1 => wrong_value(),
    ];
    (kind, number.clone(), number).prop_map(|(kind, offset, length)| EntitySpec {
        kind,
        offset,
        length,
    })
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0usize..12).prop_map(Mutation::Remove),
        (0usize..12, wrong_value()).prop_map(|(i, v)| Mutation::Retype(i, v)),
        (1usize..140).prop_map(Mutation::Nested),
        (1usize..80).prop_map(Mutation::ReplyChain),
        ("[a-z_]{1,12}", wrong_value()).prop_map(|(k, v)| Mutation::Unknown(k, v)),
    ]
}

prop_compose! {
    fn update_spec()(
        id in id_spec(),
        kind in kind_spec(),
        chat in chat_spec(),
        from in from_spec(),
        message_id in prop_oneof![
            16 => (1i64..100_000).prop_map(|n| json!(n)),
            1 => Just(json!(0)),
            1 => Just(json!(-7)),
            1 => Just(json!(i64::from(i32::MAX) + 1)),
            1 => wrong_value(),
        ],
        text in text_spec(),
        entities in prop_oneof![
            2 => Just(Vec::new()),
            1 => prop::collection::vec(entity_spec(), 1..4),
        ],
        photo in prop::bool::weighted(0.1),
        reply_to_bot in prop::bool::weighted(0.2),
        topic in prop::bool::weighted(0.1),
        mutations in prop_oneof![
            3 => Just(Vec::new()),
            1 => prop::collection::vec(mutation(), 1..3),
        ],
    ) -> UpdateSpec {
        UpdateSpec { id, kind, chat, from, message_id, text, entities, photo, reply_to_bot, topic, mutations }
    }
}

/// A fixed corpus, taken before the random cases: every kind of hostile
/// update at least once, whatever the random cases draw.
fn corpus() -> Vec<UpdateSpec> {
    let dm = |text: TextSpec| UpdateSpec {
        id: IdSpec::Fresh,
        kind: KindSpec::Message,
        chat: ChatSpec::Private { allowed: true },
        from: FromSpec::Allowed,
        message_id: json!(10),
        text,
        entities: Vec::new(),
        photo: false,
        reply_to_bot: false,
        topic: false,
        mutations: Vec::new(),
    };
    let words = |w: &str| TextSpec::Words(w.to_string());
    let with = |mut spec: UpdateSpec, change: &dyn Fn(&mut UpdateSpec)| {
        change(&mut spec);
        spec
    };
    let bad_mention = |offset: u64, length: u64| EntitySpec {
        kind: "mention",
        offset: json!(offset),
        length: json!(length),
    };
    vec![
        dm(words("hello 😀 **there**")),
        dm(TextSpec::Huge {
            atom: "😀",
            count: 30_000,
        }),
        with(dm(words("again")), &|s| s.id = IdSpec::Repeat),
        with(dm(words("no id")), &|s| s.id = IdSpec::Missing),
        with(dm(words("id as text")), &|s| {
            s.id = IdSpec::NotAnInteger(json!("12"))
        }),
        with(dm(words("negative id")), &|s| s.id = IdSpec::Negative),
        with(dm(words("huge id")), &|s| s.id = IdSpec::I64Max),
        with(dm(words("deep")), &|s| {
            s.mutations = vec![Mutation::ReplyChain(60), Mutation::Nested(100)]
        }),
        with(dm(words("😀")), &|s| {
            s.chat = ChatSpec::Group;
            s.entities = vec![
                bad_mention(1, 1),
                bad_mention(0, 9),
                bad_mention(u64::MAX, 2),
            ];
        }),
        dm(TextSpec::Command("/stop@other_bot")),
        with(dm(words("from a bot")), &|s| s.from = FromSpec::Bot),
        with(dm(words("edited")), &|s| s.kind = KindSpec::EditedMessage),
        with(dm(words("post")), &|s| s.kind = KindSpec::ChannelPost),
        with(dm(words("button")), &|s| s.kind = KindSpec::CallbackQuery),
        with(dm(words("what")), &|s| {
            s.kind = KindSpec::Unknown("future_update".into())
        }),
        with(dm(words("typed")), &|s| {
            s.mutations = vec![Mutation::Retype(0, json!({"id": "no"}))]
        }),
    ]
}

// ---------------------------------------------------------------------------
// Building the JSON
// ---------------------------------------------------------------------------

/// Fuzzed chats get ids of their own (never the ping chat).
fn chat_json(spec: &ChatSpec, salt: i64) -> Value {
    match spec {
        ChatSpec::Private { allowed: true } => {
            json!({"id": ALLOWED, "type": "private", "first_name": "Ann"})
        }
        ChatSpec::Private { allowed: false } => {
            json!({"id": 5000 + salt % 50, "type": "private", "first_name": "Eve"})
        }
        ChatSpec::Group => json!({"id": -4000 - salt % 5, "type": "group", "title": "G"}),
        ChatSpec::Supergroup => {
            json!({"id": -1_000_000_000_100i64 - salt % 5, "type": "supergroup", "title": "S"})
        }
        ChatSpec::Forum => json!({
            "id": -1_000_000_000_200i64, "type": "supergroup", "title": "F", "is_forum": true
        }),
        ChatSpec::Channel => json!({"id": -1_000_000_000_300i64, "type": "channel", "title": "C"}),
        ChatSpec::Id(id) => json!({"id": id, "type": "private", "first_name": "Odd"}),
        ChatSpec::BogusType => json!({"id": 6000, "type": "spaceship"}),
    }
}

fn from_json(spec: &FromSpec) -> Option<Value> {
    match spec {
        FromSpec::Allowed => Some(json!({"id": ALLOWED, "is_bot": false, "first_name": "Ann"})),
        FromSpec::Stranger => Some(json!({"id": 5001, "is_bot": false, "first_name": "Eve"})),
        FromSpec::Bot => {
            Some(json!({"id": 9, "is_bot": true, "first_name": "B", "username": "other_bot"}))
        }
        FromSpec::Missing => None,
        FromSpec::Id(id) => Some(json!({"id": id, "is_bot": false, "first_name": "Odd"})),
    }
}

fn text_value(spec: &TextSpec) -> Option<Value> {
    match spec {
        TextSpec::Words(words) => Some(json!(words)),
        TextSpec::Command(command) => Some(json!(command)),
        TextSpec::Mentioned(words) => Some(json!(format!("@{BOT_USERNAME} {words}"))),
        TextSpec::Huge { atom, count } => Some(json!(atom.repeat(*count))),
        TextSpec::Missing => None,
        TextSpec::WrongType(value) => Some(value.clone()),
    }
}

fn message_json(spec: &UpdateSpec, salt: i64) -> Value {
    let mut message = Map::new();
    message.insert("message_id".into(), spec.message_id.clone());
    message.insert("date".into(), json!(1_700_000_000));
    message.insert("chat".into(), chat_json(&spec.chat, salt));
    if let Some(from) = from_json(&spec.from) {
        message.insert("from".into(), from);
    }
    let (text_key, entities_key) = match spec.photo {
        true => ("caption", "caption_entities"),
        false => ("text", "entities"),
    };
    if spec.photo {
        message.insert(
            "photo".into(),
            json!([{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}]),
        );
    }
    if let Some(text) = text_value(&spec.text) {
        message.insert(text_key.into(), text);
    }
    if !spec.entities.is_empty() {
        let entities: Vec<Value> = spec
            .entities
            .iter()
            .map(|e| {
                let mut entity = json!({"type": e.kind, "offset": e.offset, "length": e.length});
                match e.kind {
                    "text_link" => entity["url"] = json!("http://example.com"),
                    "text_mention" => {
                        entity["user"] = json!({"id": 1, "is_bot": false, "first_name": "U"})
                    }
                    "custom_emoji" => entity["custom_emoji_id"] = json!("1"),
                    _ => {}
                }
                entity
            })
            .collect();
        message.insert(entities_key.into(), Value::Array(entities));
    }
    if spec.reply_to_bot {
        message.insert(
            "reply_to_message".into(),
            json!({
                "message_id": 1, "date": 1_700_000_000, "chat": chat_json(&spec.chat, salt),
                "from": {"id": BOT_ID, "is_bot": true, "first_name": "Bot", "username": BOT_USERNAME},
                "text": "earlier",
            }),
        );
    }
    if spec.topic {
        message.insert("message_thread_id".into(), json!(77));
        message.insert("is_topic_message".into(), json!(true));
    }
    let mut message = Value::Object(message);
    for mutation in &spec.mutations {
        mutate(&mut message, mutation);
    }
    message
}

fn mutate(message: &mut Value, mutation: &Mutation) {
    let Some(object) = message.as_object_mut() else {
        return;
    };
    let mut keys: Vec<String> = object.keys().cloned().collect();
    keys.sort();
    let key_at = |i: usize| keys.get(i % keys.len().max(1)).cloned();
    match mutation {
        Mutation::Remove(i) => {
            if let Some(key) = key_at(*i) {
                object.remove(&key);
            }
        }
        Mutation::Retype(i, value) => {
            if let Some(key) = key_at(*i) {
                object.insert(key, value.clone());
            }
        }
        Mutation::Nested(depth) => {
            // Built as text and parsed, as every real entry point does
            // (serde_json refuses more than 128 levels).
            let text = format!("{}1{}", "[".repeat(*depth), "]".repeat(*depth));
            if let Ok(nested) = serde_json::from_str::<Value>(&text) {
                object.insert("nested_field".into(), nested);
            }
        }
        Mutation::ReplyChain(depth) => {
            let mut chain = Value::Object(object.clone());
            for _ in 0..*depth {
                let mut outer = object.clone();
                outer.insert("reply_to_message".into(), chain);
                chain = Value::Object(outer);
            }
            // Only as deep as the parser accepts.
            let reparsed = serde_json::from_str::<Value>(&chain.to_string());
            if let Ok(Value::Object(deep)) = reparsed {
                *object = deep;
            }
        }
        Mutation::Unknown(key, value) => {
            object.insert(format!("x_{key}"), value.clone());
        }
    }
}

/// The raw update and the integer id it carries (if any). `None` if the
/// update is nested deeper than the JSON parser accepts: such an update
/// never reaches the intake (the webhook answers 400, teloxide refuses the
/// `getUpdates` answer), so every update is built as every real one is: as
/// text, then parsed.
fn update_json(spec: &UpdateSpec, case_ids: &[i64]) -> Option<(Value, Option<i64>)> {
    let h = harness();
    let salt = h.next_id.load(Ordering::Relaxed);
    let fresh = || h.next_id.fetch_add(1, Ordering::Relaxed);
    let id = match &spec.id {
        IdSpec::Fresh => Some(json!(fresh())),
        IdSpec::Zero => Some(json!(0)),
        IdSpec::Negative => Some(json!(-fresh())),
        IdSpec::I32Max => Some(json!(i32::MAX)),
        IdSpec::AboveU32 => Some(json!(i64::from(u32::MAX) + fresh())),
        IdSpec::I64Max => Some(json!(i64::MAX)),
        IdSpec::Repeat => Some(json!(case_ids.last().copied().unwrap_or_else(fresh))),
        IdSpec::Missing => None,
        IdSpec::NotAnInteger(value) => Some(value.clone()),
    };
    let message = message_json(spec, salt);
    let mut update = Map::new();
    if let Some(id) = &id {
        update.insert("update_id".into(), id.clone());
    }
    let callback = || {
        json!({
            "id": "cbq-1", "from": from_json(&spec.from).unwrap_or(json!({"id": 1})),
            "chat_instance": "i", "data": "press", "message": message.clone(),
        })
    };
    match &spec.kind {
        KindSpec::Message => {
            update.insert("message".into(), message.clone());
        }
        KindSpec::EditedMessage => {
            let mut edited = message.clone();
            edited["edit_date"] = json!(1_700_000_100);
            update.insert("edited_message".into(), edited);
        }
        KindSpec::ChannelPost => {
            update.insert("channel_post".into(), message.clone());
        }
        KindSpec::EditedChannelPost => {
            update.insert("edited_channel_post".into(), message.clone());
        }
        KindSpec::BusinessMessage => {
            update.insert("business_message".into(), message.clone());
        }
        KindSpec::CallbackQuery => {
            update.insert("callback_query".into(), callback());
        }
        KindSpec::InlineQuery => {
            let query =
                json!({"id": "q", "from": from_json(&spec.from), "query": "x", "offset": ""});
            update.insert("inline_query".into(), query);
        }
        KindSpec::MyChatMember => {
            update.insert(
                "my_chat_member".into(),
                json!({"chat": message["chat"], "date": 1}),
            );
        }
        KindSpec::Unknown(name) => {
            update.insert(format!("zz_{name}"), message.clone());
        }
        KindSpec::None => {}
        KindSpec::Two => {
            update.insert("message".into(), message.clone());
            update.insert("callback_query".into(), callback());
        }
    }
    let integer_id = update.get("update_id").and_then(Value::as_i64);
    let text = Value::Object(update).to_string();
    let raw = serde_json::from_str(&text).ok()?;
    Some((raw, integer_id))
}

// ---------------------------------------------------------------------------
// The property
// ---------------------------------------------------------------------------

/// How deep objects and arrays nest (without recursion).
fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut todo = vec![(value, 0)];
    while let Some((value, level)) = todo.pop() {
        let children: Vec<&Value> = match value {
            Value::Array(items) => items.iter().collect(),
            Value::Object(fields) => fields.values().collect(),
            _ => continue,
        };
        deepest = deepest.max(level + 1);
        todo.extend(children.into_iter().map(|child| (child, level + 1)));
    }
    deepest
}

async fn wait_until<F, Fut>(limit: Duration, mut done: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if done().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn check_case(specs: Vec<UpdateSpec>) -> Result<(), TestCaseError> {
    let h = harness();
    h.runtime.block_on(async {
        let mut case_ids = Vec::new();
        let mut accepted = Vec::new();
        for spec in &specs {
            let Some((raw, id)) = update_json(spec, &case_ids) else {
                h.stats.lock().unwrap().unparseable += 1;
                continue;
            };
            let deep = depth(&raw) > 8;
            let intake = h.intake.clone();
            // In a spawned task, as in the bot (same stack, panics caught).
            let taken = tokio::spawn(async move { intake.take(raw).await }).await;
            let taken = match taken {
                Ok(taken) => taken,
                Err(error) => return Err(TestCaseError::fail(format!("take panicked: {error}"))),
            };
            let intook = taken.map_err(|e| TestCaseError::fail(format!("take failed: {e}")))?;
            {
                let mut stats = h.stats.lock().unwrap();
                stats.updates += 1;
                stats.deep += usize::from(deep);
                stats.without_id += usize::from(id.is_none());
                stats.duplicates += usize::from(intook == Intook::Duplicate);
            }
            let Some(id) = id else {
                prop_assert_eq!(intook, Intook::Ignored, "no integer update_id: ignored");
                continue;
            };
            let redelivery = !h.seen.lock().unwrap().insert(id);
            case_ids.push(id);
            if redelivery {
                prop_assert_eq!(intook, Intook::Duplicate, "update {} was taken before", id);
            } else {
                prop_assert_ne!(intook, Intook::Duplicate, "update {} is new", id);
            }
            let entry = h
                .bot
                .store
                .inbox()
                .inbox_entry(id)
                .await
                .expect("the inbox is readable");
            prop_assert!(entry.is_some(), "update {} has an inbox row", id);
            if redelivery {
                continue;
            }
            let entry = entry.expect("checked");
            match intook {
                Intook::Ignored => {
                    prop_assert_eq!(entry.state, InboxState::Dropped);
                    prop_assert!(
                        entry.reason.as_deref().is_some_and(|r| !r.is_empty()),
                        "an ignored update says why"
                    );
                    prop_assert!(!spec.must_be_accepted(), "update {} must be accepted", id);
                    let reason = entry.reason.unwrap_or_default();
                    *h.stats.lock().unwrap().ignored.entry(reason).or_default() += 1;
                }
                Intook::Accepted => {
                    prop_assert!(!spec.must_be_ignored(), "update {} must be ignored", id);
                    let huge = matches!(spec.text, TextSpec::Huge { .. });
                    accepted.push((id, huge));
                }
                Intook::Duplicate => unreachable!("checked above"),
            }
        }

        // Every accepted message comes to an end.
        let store = &h.bot.store;
        let pending = &accepted;
        let all_done = wait_until(SETTLE, || async move {
            for (id, _) in pending {
                match store.inbox().inbox_entry(*id).await {
                    Ok(Some(entry)) if entry.state.is_terminal() => {}
                    _ => return false,
                }
            }
            true
        })
        .await;
        if !all_done {
            let mut states = Vec::new();
            for (id, _) in &accepted {
                let entry = store.inbox().inbox_entry(*id).await.ok().flatten();
                states.push((id, entry.map(|e| e.state)));
            }
            return Err(TestCaseError::fail(format!(
                "accepted messages never finished: {states:?}"
            )));
        }
        for (id, huge) in &accepted {
            let state = store
                .inbox()
                .inbox_entry(*id)
                .await
                .ok()
                .flatten()
                .map(|e| e.state);
            let mut stats = h.stats.lock().unwrap();
            stats.accepted += 1;
            let name = state.map_or("missing", InboxState::as_str);
            *stats.outcomes.entry(name).or_default() += 1;
            stats.huge_accepted += usize::from(*huge && state == Some(InboxState::Answered));
        }

        // The bot still serves: a normal message through getUpdates.
        let n = h.pings.fetch_add(1, Ordering::Relaxed);
        let ping = format!("ping {n}");
        h.fake.push_text(PING, PING, &ping);
        let expected = &format!("echo: {ping}");
        let served = wait_until(SETTLE, || async move {
            h.fake.sent_texts(PING).contains(expected)
        })
        .await;
        prop_assert!(
            served,
            "the bot answers {:?} after the hostile updates",
            ping
        );
        Ok(())
    })
}

#[test]
fn hostile_updates_never_panic_and_every_update_gets_an_outcome() {
    let config = ProptestConfig {
        cases: 128,
        max_shrink_iters: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    let started = Instant::now();
    if let Err(error) = check_case(corpus()) {
        panic!("the fixed corpus failed: {error}");
    }
    let mut runner = TestRunner::new(config);
    let result = runner.run(&prop::collection::vec(update_spec(), 1..8), check_case);
    let stats = harness().stats.lock().unwrap().clone();
    println!("{:.1?}: {stats:#?}", started.elapsed());
    if let Err(error) = result {
        panic!("{error}");
    }
    // The corpus (and, most of the time, the generators) reached the
    // interesting places.
    assert!(stats.accepted > 0 && stats.duplicates > 0 && stats.without_id > 0);
    assert!(
        stats.ignored.len() >= 4,
        "several reasons to ignore: {:?}",
        stats.ignored
    );
    assert!(
        stats.huge_accepted > 0,
        "a 100 KB message was accepted and answered"
    );
    assert!(stats.deep > 0, "deeply nested updates were taken");
}

#[test]
fn a_button_press_is_taken_once_and_its_redelivery_is_a_duplicate() {
    let h = harness();
    h.runtime.block_on(async {
        let id = h.next_id.fetch_add(1, Ordering::Relaxed);
        let press = json!({
            "update_id": id,
            "callback_query": {
                "id": "cbq-dup", "chat_instance": "i", "data": "b:nosuchbutton",
                "from": {"id": ALLOWED, "is_bot": false, "first_name": "A"},
            },
        });
        let intake = &h.intake_with_buttons;
        assert_eq!(intake.take(press.clone()).await.unwrap(), Intook::Accepted);
        assert_eq!(intake.take(press).await.unwrap(), Intook::Duplicate);
    });
}
