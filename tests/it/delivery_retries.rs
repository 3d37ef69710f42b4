//! The delivery engine's retry rules, failure by failure, through
//! `Delivery::call_with` with requests that fail as told: what is retried
//! (429s, transient failures, HTTP 5xx, an unanswered idempotent request),
//! what is never repeated (an unanswered send: it may have arrived), when a
//! send falls back to plain text, and when it gives up. Network failures
//! are real ones, from sockets on 127.0.0.1: a refused connection (nothing
//! was sent) and a connection closed after the request was read (it may
//! have been). Against the fake Bot API: a send answered 500, one that
//! hangs, one answered with garbage, and the probe that says when Telegram
//! answers again, each through both clients (the direct one and the bot's
//! reqwest one, kept where a proxy is named); the direct client's own
//! failures (refused, hung up on, a certificate no root vouches for). And
//! the cap on a bot's requests in flight, which a control request goes past.

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::fake_bot::{Failure, FakeBotApi};
use telegate::delivery::api::AttemptError;
use telegate::delivery::bot_api::BotApi;
use telegate::delivery::render;
use telegate::delivery::telegram::{
    transient_backoff, Idempotence, Priority, MAX_BACKOFF, MAX_IN_FLIGHT,
};
use telegate::delivery::{ChatTarget, Delivery, DeliveryConfig, RateLimits};
use telegate::reply::{DeliveryError, Reply};
use teloxide::payloads::GetMe;
use teloxide::types::Seconds;
use teloxide::{ApiError, Bot, RequestError};

const CHAT: ChatTarget = ChatTarget {
    chat_id: 7,
    thread_id: None,
    is_group: false,
    user: None,
};

fn delivery(max_attempts: u32) -> Delivery {
    delivery_through(BotApi::direct(Bot::new("0:test")), max_attempts)
}

fn delivery_through(api: BotApi, max_attempts: u32) -> Delivery {
    Delivery::with_api(
        api,
        DeliveryConfig {
            limits: RateLimits {
                per_chat_interval: Duration::from_millis(1),
                group_per_minute: 0,
                global_per_second: 0,
            },
            max_attempts,
            ..DeliveryConfig::default()
        },
    )
}

/// What the request did on each attempt, in order: `true` when it was
/// asked for plain text.
#[derive(Default)]
struct Attempts {
    count: AtomicU32,
    plain: std::sync::Mutex<Vec<bool>>,
}

impl Attempts {
    fn note(&self, plain: bool) -> u32 {
        self.plain.lock().unwrap().push(plain);
        self.count.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn count(&self) -> u32 {
        self.count.load(Ordering::SeqCst)
    }
}

/// Fails with `failure()` on the first `failing` attempts, then answers 42.
async fn call(
    delivery: &Delivery,
    idempotence: Idempotence,
    failing: u32,
    failure: impl Fn() -> RequestError + Send + Sync + 'static,
) -> (Result<Option<u32>, DeliveryError>, Arc<Attempts>) {
    let attempts = Arc::new(Attempts::default());
    let failure = Arc::new(failure);
    let result = {
        let attempts = attempts.clone();
        delivery
            .call_with(CHAT, idempotence, Priority::Normal, move |plain| {
                let attempt = attempts.note(plain);
                let failure = failure.clone();
                async move {
                    if attempt <= failing {
                        Err(failure())
                    } else {
                        Ok(42)
                    }
                }
            })
            .await
    };
    (result, attempts)
}

/// `calling`, which must give up: within an hour of tokio's paused clock
/// (every backoff together is far less), not by retrying without end.
async fn give_up<T>(calling: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(3600), calling)
        .await
        .expect("retried without end")
}

fn io_error() -> RequestError {
    RequestError::Io(Arc::new(std::io::Error::other("broken pipe")))
}

/// An answer that is not JSON: Telegram may have carried the request out.
fn garbled_answer() -> RequestError {
    let source = serde_json::from_str::<serde_json::Value>("<html>").unwrap_err();
    RequestError::InvalidJson {
        source: Arc::new(source),
        raw: "<html>".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn an_answered_request_gives_its_value_through_call_and_call_with() {
    let delivery = delivery(3);
    let (result, attempts) = call(&delivery, Idempotence::Unsafe, 0, io_error).await;
    assert_eq!(result.unwrap(), Some(42));
    assert_eq!(attempts.count(), 1);
    let value = delivery
        .call(CHAT, Idempotence::Unsafe, |_| async {
            Ok::<_, RequestError>(7)
        })
        .await;
    assert_eq!(value.unwrap(), Some(7));
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_is_retried_until_it_succeeds_or_attempts_run_out() {
    let delivery = delivery(3);
    let (result, attempts) = call(&delivery, Idempotence::Unsafe, 2, io_error).await;
    assert_eq!(result.unwrap(), Some(42));
    assert_eq!(attempts.count(), 3);

    let (result, attempts) =
        give_up(call(&delivery, Idempotence::Unsafe, u32::MAX, io_error)).await;
    assert!(
        matches!(result, Err(DeliveryError::Unavailable(_))),
        "{result:?}"
    );
    assert_eq!(attempts.count(), 3, "gave up after max_attempts");
    assert_eq!(delivery.stats().failures, 1);
}

#[tokio::test(start_paused = true)]
async fn retry_after_waits_and_never_counts_as_an_attempt() {
    let delivery = delivery(2);
    let (result, attempts) = call(&delivery, Idempotence::Unsafe, 4, || {
        RequestError::RetryAfter(Seconds::from_seconds(3))
    })
    .await;
    assert_eq!(result.unwrap(), Some(42));
    assert_eq!(attempts.count(), 5, "a 429 made the message give up");
    assert_eq!(delivery.stats().retry_after_hits, 4);
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_send_is_never_repeated_but_an_idempotent_request_is() {
    let delivery = delivery(3);
    let (result, attempts) = call(&delivery, Idempotence::Unsafe, 1, garbled_answer).await;
    match result {
        Err(error @ DeliveryError::Ambiguous(_)) => {
            assert!(
                error.to_string().contains("may or may not have arrived"),
                "{error}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        attempts.count(),
        1,
        "a send that may have arrived was repeated"
    );

    let (result, attempts) = call(&delivery, Idempotence::Safe, 2, garbled_answer).await;
    assert_eq!(result.unwrap(), Some(42));
    assert_eq!(attempts.count(), 3);

    let (result, attempts) =
        give_up(call(&delivery, Idempotence::Safe, u32::MAX, garbled_answer)).await;
    assert!(result.is_err());
    assert_eq!(attempts.count(), 3, "gave up after max_attempts");
}

#[tokio::test(start_paused = true)]
async fn refused_entities_fall_back_to_plain_text_once_then_give_up() {
    let delivery = delivery(3);
    let refused = || RequestError::Api(ApiError::CantParseEntities("bad offset".into()));
    let (result, attempts) = call(&delivery, Idempotence::Unsafe, 1, refused).await;
    assert_eq!(result.unwrap(), Some(42));
    assert_eq!(*attempts.plain.lock().unwrap(), [false, true]);
    assert_eq!(delivery.stats().plain_fallbacks, 1);

    let (result, attempts) = give_up(call(&delivery, Idempotence::Unsafe, u32::MAX, refused)).await;
    assert!(
        matches!(result, Err(DeliveryError::Rejected(_))),
        "{result:?}"
    );
    assert_eq!(*attempts.plain.lock().unwrap(), [false, true]);
}

#[tokio::test(start_paused = true)]
async fn an_unchanged_edit_is_a_success_with_nothing_to_return() {
    let delivery = delivery(3);
    let (result, attempts) = call(&delivery, Idempotence::Safe, 1, || {
        RequestError::Api(ApiError::MessageNotModified)
    })
    .await;
    assert_eq!(result.unwrap(), None);
    assert_eq!(attempts.count(), 1);
}

#[tokio::test]
async fn a_panicking_request_panics_its_caller() {
    let delivery = delivery(3);
    let caller = tokio::spawn(async move {
        delivery
            .call(CHAT, Idempotence::Unsafe, |_| async {
                if true {
                    panic!("deliberate");
                }
                Ok::<u32, RequestError>(1)
            })
            .await
    });
    let failed = caller.await.expect_err("the panic was swallowed");
    assert!(failed.is_panic());
}

/// A real network error from `url`.
async fn network_error(url: String) -> RequestError {
    let error = reqwest::Client::new()
        .post(url)
        .body("{}")
        .send()
        .await
        .expect_err("the request fails");
    RequestError::from(error)
}

/// A port on 127.0.0.1 with nothing listening on it.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A server that reads each request and closes the connection unanswered;
/// and how many requests it read.
async fn hanging_up_server() -> (u16, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let read = Arc::new(AtomicU32::new(0));
    let counted = read.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let counted = counted.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut buf = [0u8; 4096];
                if socket.read(&mut buf).await.is_ok_and(|n| n > 0) {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                drop(socket);
            });
        }
    });
    (port, read)
}

/// Sends as `op` would, once per attempt, through a real socket.
async fn send_through(
    delivery: &Delivery,
    url: String,
) -> (Result<Option<u32>, DeliveryError>, Arc<Attempts>) {
    let attempts = Arc::new(Attempts::default());
    let counted = attempts.clone();
    let result = delivery
        .call_with(CHAT, Idempotence::Unsafe, Priority::Normal, move |plain| {
            counted.note(plain);
            let url = url.clone();
            async move { Err::<u32, _>(network_error(url).await) }
        })
        .await;
    (result, attempts)
}

#[tokio::test]
async fn a_send_that_could_not_connect_is_retried_one_that_got_no_answer_is_not() {
    let delivery = delivery(2);
    // Refused: the request never left, so trying again is safe.
    let refused = format!("http://127.0.0.1:{}/bot0:test/sendMessage", closed_port());
    let (result, attempts) =
        tokio::time::timeout(Duration::from_secs(30), send_through(&delivery, refused))
            .await
            .expect("retried without end");
    assert_eq!(attempts.count(), 2, "a refused connection was not retried");
    match result {
        Err(DeliveryError::Unavailable(why)) => {
            assert!(!why.contains("may or may not"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    // Read, then hung up on: the message may be in the chat.
    let (port, _) = hanging_up_server().await;
    let unanswered = format!("http://127.0.0.1:{port}/bot0:test/sendMessage");
    let (result, attempts) =
        tokio::time::timeout(Duration::from_secs(30), send_through(&delivery, unanswered))
            .await
            .expect("retried without end");
    assert_eq!(
        attempts.count(),
        1,
        "a send that may have arrived was repeated"
    );
    assert!(
        matches!(result, Err(DeliveryError::Ambiguous(_))),
        "{result:?}"
    );
}

/// The direct client tells a refused connection (nothing sent: retried)
/// from a request read and hung up on (it may have arrived: never
/// repeated), as reqwest's errors are told apart above.
#[tokio::test]
async fn the_direct_client_tells_a_refused_connection_from_a_request_hung_up_on() {
    let at = |port: u16| {
        let url = format!("http://127.0.0.1:{port}").parse().unwrap();
        BotApi::direct(Bot::new("0:test").set_api_url(url))
    };
    let refused = at(closed_port());
    let (port, requests_read) = hanging_up_server().await;
    let hung_up = at(port);
    match refused.clone().post(GetMe::new()).await {
        Err(AttemptError::NotSent(why)) => assert!(!why.contains("0:test"), "{why}"),
        other => panic!("{other:?}"),
    }
    match hung_up.clone().post(GetMe::new()).await {
        Err(AttemptError::Unanswered(why)) => assert!(!why.contains("0:test"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Through the delivery engine: the refused send is retried (and then
    // reported as not sent), the one hung up on is not.
    let result = delivery_through(refused, 2)
        .deliver_reply(fake_chat(), &Reply::answer("refused"), None)
        .await;
    assert!(
        matches!(&result, Err(DeliveryError::Unavailable(_))),
        "{result:?}"
    );
    let before = requests_read.load(Ordering::SeqCst);
    let result = delivery_through(hung_up, 5)
        .deliver_reply(fake_chat(), &Reply::answer("hung up on"), None)
        .await;
    assert!(
        matches!(&result, Err(DeliveryError::Ambiguous(_))),
        "{result:?}"
    );
    assert_eq!(
        requests_read.load(Ordering::SeqCst) - before,
        1,
        "a send that may have arrived was repeated"
    );
}

/// An https API URL is spoken to over TLS, and a server whose certificate
/// no known root vouches for (a self-signed one for `localhost`) is
/// refused before any request is written: nothing sent, retried as such.
#[tokio::test]
async fn the_direct_client_refuses_a_server_no_known_root_vouches_for() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cert = CertificateDer::from_pem_slice(include_bytes!("../fixtures/tls/self_signed.crt"))
        .expect("the fixture's certificate");
    let key = PrivateKeyDer::from_pem_slice(include_bytes!("../fixtures/tls/self_signed.key"))
        .expect("the fixture's key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (connections, handshakes) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (counted_connections, counted_handshakes) = (connections.clone(), handshakes.clone());
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counted_connections.fetch_add(1, Ordering::SeqCst);
            if acceptor.accept(socket).await.is_ok() {
                counted_handshakes.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let url = format!("https://localhost:{port}").parse().unwrap();
    let api = BotApi::direct(Bot::new("0:test").set_api_url(url));
    match api.post(GetMe::new()).await {
        Err(AttemptError::NotSent(why)) => {
            assert!(why.contains("certificate"), "{why}");
            assert!(!why.contains("0:test"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        connections.load(Ordering::SeqCst) >= 1,
        "TLS was never tried"
    );
    assert_eq!(
        handshakes.load(Ordering::SeqCst),
        0,
        "the certificate was taken"
    );
}

#[tokio::test(start_paused = true)]
async fn backoffs_double_and_neither_429s_nor_the_plain_fallback_use_up_attempts() {
    let delivery = delivery(3);
    // Two transient failures: 400 ms, then 800 ms of backoff.
    let started = tokio::time::Instant::now();
    let (result, _) = call(&delivery, Idempotence::Unsafe, 2, io_error).await;
    assert_eq!(result.unwrap(), Some(42));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1200) && waited < Duration::from_millis(1300),
        "{waited:?}"
    );
    // Three 429s, then two transient failures: still within 3 attempts.
    let failures = Arc::new(AtomicU32::new(0));
    let mixed = move || match failures.fetch_add(1, Ordering::SeqCst) {
        0..=2 => RequestError::RetryAfter(Seconds::from_seconds(1)),
        _ => io_error(),
    };
    let (result, attempts) = call(&delivery, Idempotence::Unsafe, 5, mixed).await;
    assert_eq!(result.unwrap(), Some(42), "429s used up the attempts");
    assert_eq!(attempts.count(), 6);
    // Refused entities once, then two transient failures: the same.
    let failures = Arc::new(AtomicU32::new(0));
    let mixed = move || match failures.fetch_add(1, Ordering::SeqCst) {
        0 => RequestError::Api(ApiError::CantParseEntities("bad offset".into())),
        _ => io_error(),
    };
    let (result, attempts) = call(&delivery, Idempotence::Unsafe, 3, mixed).await;
    assert_eq!(
        result.unwrap(),
        Some(42),
        "the plain fallback used up an attempt"
    );
    assert_eq!(attempts.count(), 4);
}

const FAKE_CHAT: i64 = 42;

fn fake_chat() -> ChatTarget {
    ChatTarget {
        chat_id: FAKE_CHAT,
        thread_id: None,
        is_group: false,
        user: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commands_reply_goes_out_before_replies_already_waiting() {
    let fake = FakeBotApi::start().await;
    let delivery = delivery_through(BotApi::direct(fake.bot()), 3);
    // The first answer is slow to be answered: the others wait behind it.
    fake.fail_next("sendMessage", 1, Failure::Delay(Duration::from_millis(500)));
    let mut sending = Vec::new();
    for (text, command) in [
        ("one", false),
        ("two", false),
        ("three", false),
        ("Stopped", true),
    ] {
        let delivery = delivery.clone();
        let reply = if command {
            Reply::command(text)
        } else {
            Reply::answer(text)
        };
        sending.push(tokio::spawn(async move {
            delivery.deliver_reply(fake_chat(), &reply, None).await
        }));
        // Queued in this order.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for sent in sending {
        sent.await.unwrap().unwrap();
    }
    assert_eq!(
        fake.sent_texts(FAKE_CHAT),
        ["one", "Stopped", "two", "three"],
        "the command's reply waited behind answers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_whose_entities_are_refused_is_redone_in_plain_text() {
    let fake = FakeBotApi::start().await;
    let delivery = delivery_through(BotApi::direct(fake.bot()), 3);
    let ids = delivery
        .deliver_reply(fake_chat(), &Reply::answer("draft"), None)
        .await
        .unwrap();
    let formatted = render("**bold** move");
    assert!(!formatted.entities.is_empty());
    delivery
        .edit_chunk(fake_chat(), ids[0], &formatted)
        .await
        .unwrap();
    fake.fail_next(
        "editMessageText",
        1,
        Failure::BadRequest("Bad Request: can't parse entities: unsupported start tag".into()),
    );
    let formatted = render("**bolder** move");
    delivery
        .edit_chunk(fake_chat(), ids[0], &formatted)
        .await
        .unwrap();
    let edits: Vec<Option<serde_json::Value>> = fake
        .calls_to("editMessageText")
        .into_iter()
        .map(|call| call.body.get("entities").cloned())
        .collect();
    assert_eq!(edits.len(), 3, "{edits:?}");
    assert!(
        edits[0].is_some(),
        "a formatted edit went out without its entities"
    );
    assert!(edits[1].is_some());
    assert!(
        edits[2].is_none(),
        "the plain-text redo still carried entities"
    );
    assert_eq!(delivery.stats().plain_fallbacks, 1);
    // A plain edit carries no entities at all.
    delivery
        .edit_chunk(fake_chat(), ids[0], &render("plain words"))
        .await
        .unwrap();
    let last = fake.calls_to("editMessageText").pop().unwrap();
    assert!(last.body.get("entities").is_none(), "{:?}", last.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typing_action_refused_with_429_is_counted_and_not_retried() {
    let fake = FakeBotApi::start().await;
    let delivery = delivery_through(BotApi::direct(fake.bot()), 3);
    fake.fail_next("sendChatAction", 1, Failure::RetryAfter(2));
    assert!(!delivery.typing(fake_chat()).await);
    let stats = delivery.stats();
    assert_eq!(
        (stats.retry_after_hits, stats.retry_after_wait_ms),
        (1, 2000)
    );
    assert_eq!(fake.calls_to("sendChatAction").len(), 1);
}

/// Fails with HTTP `status` on the first `failing` attempts, then answers 42.
async fn call_server_error(
    delivery: &Delivery,
    idempotence: Idempotence,
    failing: u32,
    status: u16,
) -> (Result<Option<u32>, DeliveryError>, Arc<Attempts>) {
    let attempts = Arc::new(Attempts::default());
    let counted = attempts.clone();
    let result = delivery
        .call_with(CHAT, idempotence, Priority::Normal, move |plain| {
            let attempt = counted.note(plain);
            async move {
                if attempt <= failing {
                    Err(AttemptError::Server(status))
                } else {
                    Ok(42)
                }
            }
        })
        .await;
    (result, attempts)
}

#[tokio::test(start_paused = true)]
async fn a_server_error_is_retried_even_for_a_send_within_bounded_backoff() {
    let delivery = delivery(8);
    // A 500 means Telegram did not carry the send out: trying again is safe.
    let (result, attempts) = call_server_error(&delivery, Idempotence::Unsafe, 6, 500).await;
    assert_eq!(result.unwrap(), Some(42));
    assert_eq!(attempts.count(), 7);
    let (result, attempts) = give_up(call_server_error(
        &delivery,
        Idempotence::Unsafe,
        u32::MAX,
        502,
    ))
    .await;
    match result {
        Err(DeliveryError::Unavailable(why)) => assert!(why.contains("HTTP 502"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(attempts.count(), 8, "gave up after max_attempts");
    // The waits double and stop growing.
    assert_eq!(transient_backoff(1), Duration::from_millis(400));
    assert_eq!(transient_backoff(2), Duration::from_millis(800));
    assert_eq!(transient_backoff(30), MAX_BACKOFF);
    let total: Duration = (1..8).map(transient_backoff).sum();
    assert!(
        total >= Duration::from_secs(30),
        "a 30 s outage outlasts the retries: {total:?}"
    );
}

/// Clients of `fake` that give up on an unanswered request after half a
/// second (teloxide's own wait 17 s): the direct one, and the bot's own
/// reqwest client (kept where a proxy is named).
fn impatient(fake: &FakeBotApi) -> [BotApi; 2] {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let bot = Bot::with_client(fake.token(), client).set_api_url(fake.url());
    [
        BotApi::direct(bot.clone()).with_timeout(Duration::from_millis(500)),
        BotApi::through_bot_client(bot),
    ]
}

/// Runs `test` against a fresh fake for each of [`impatient`]'s clients.
async fn with_each_client<F, Fut>(test: F)
where
    F: Fn(FakeBotApi, Delivery) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for client in 0..2 {
        let fake = FakeBotApi::start().await;
        let api = impatient(&fake)[client].clone();
        assert_eq!(api.is_direct(), client == 0);
        test(fake, delivery_through(api, 5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_answered_500_is_retried_and_arrives_once() {
    with_each_client(a_send_answered_500_is_retried_and_arrives_once_through).await;
}

async fn a_send_answered_500_is_retried_and_arrives_once_through(
    fake: FakeBotApi,
    delivery: Delivery,
) {
    fake.fail_next("sendMessage", 2, Failure::ServerError(500));
    let ids = delivery
        .deliver_reply(fake_chat(), &Reply::answer("hello"), None)
        .await
        .expect("delivered after the 500s");
    assert_eq!(ids.len(), 1);
    assert_eq!(fake.sent_texts(FAKE_CHAT), ["hello"]);
    let sends = fake.calls_to("sendMessage");
    assert_eq!(sends.len(), 3, "{sends:?}");
    assert_eq!(sends[0].outcome.error_code(), Some(500));
    // An edit answered 502 is retried the same way.
    fake.fail_next("editMessageText", 1, Failure::ServerError(502));
    delivery
        .edit_chunk(fake_chat(), ids[0], &render("hello again"))
        .await
        .expect("edited after the 502");
    assert_eq!(fake.sent_texts(FAKE_CHAT), ["hello again"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_that_hangs_or_is_answered_with_garbage_is_never_repeated() {
    with_each_client(a_send_that_hangs_or_is_answered_with_garbage_is_never_repeated_through).await;
}

async fn a_send_that_hangs_or_is_answered_with_garbage_is_never_repeated_through(
    fake: FakeBotApi,
    delivery: Delivery,
) {
    fake.fail_next("sendMessage", 1, Failure::Hang);
    let result = delivery
        .deliver_reply(fake_chat(), &Reply::answer("hung"), None)
        .await;
    assert!(
        matches!(result, Err(DeliveryError::Ambiguous(_))),
        "{result:?}"
    );
    assert_eq!(
        fake.calls_to("sendMessage").len(),
        1,
        "a hung send was repeated"
    );

    // Carried out, but the answer cannot be read: it is in the chat once.
    fake.fail_next("sendMessage", 1, Failure::Garbage);
    let result = delivery
        .deliver_reply(fake_chat(), &Reply::answer("garbled"), None)
        .await;
    assert!(
        matches!(result, Err(DeliveryError::Ambiguous(_))),
        "{result:?}"
    );
    assert_eq!(
        fake.calls_to("sendMessage").len(),
        2,
        "a garbled send was repeated"
    );
    assert_eq!(fake.sent_texts(FAKE_CHAT), ["garbled"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_telegram_ends_with_the_first_answer_of_the_api() {
    with_each_client(waiting_for_telegram_ends_with_the_first_answer_of_the_api_through).await;
}

async fn waiting_for_telegram_ends_with_the_first_answer_of_the_api_through(
    fake: FakeBotApi,
    delivery: Delivery,
) {
    fake.fail_next("getMe", 1, Failure::ServerError(503));
    fake.fail_next("getMe", 1, Failure::Garbage);
    fake.fail_next("getMe", 1, Failure::Hang);
    tokio::time::timeout(Duration::from_secs(60), delivery.wait_until_answering())
        .await
        .expect("the probe saw the API answer");
    let probes = fake.calls_to("getMe");
    assert_eq!(probes.len(), 4, "{probes:?}");
    assert!(probes[3].outcome.is_ok());
    // An API error is an answer too.
    fake.fail_next(
        "getMe",
        1,
        Failure::Api {
            code: 401,
            description: "Unauthorized".into(),
        },
    );
    tokio::time::timeout(Duration::from_secs(60), delivery.wait_until_answering())
        .await
        .expect("an API error ends the wait");
    assert_eq!(fake.calls_to("getMe").len(), 5);
}

/// What the held requests of [`in_flight_is_capped_and_control_goes_past`]
/// saw: how many ran at once, at most, and whether the control one ran.
#[derive(Default)]
struct Held {
    now: AtomicU32,
    most: AtomicU32,
    control_ran: std::sync::atomic::AtomicBool,
}

#[tokio::test]
async fn in_flight_is_capped_and_control_goes_past() {
    let delivery = delivery(1);
    let held = Arc::new(Held::default());
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let sends = (0..(MAX_IN_FLIGHT as i64 + 24)).map(|chat| {
        let (delivery, held, release) = (delivery.clone(), held.clone(), release.clone());
        tokio::spawn(async move {
            let target = ChatTarget {
                chat_id: 100 + chat,
                ..CHAT
            };
            delivery
                .call_with(target, Idempotence::Unsafe, Priority::Normal, move |_| {
                    let (held, release) = (held.clone(), release.clone());
                    async move {
                        let now = held.now.fetch_add(1, Ordering::SeqCst) + 1;
                        held.most.fetch_max(now, Ordering::SeqCst);
                        let _permit = release.acquire().await;
                        held.now.fetch_sub(1, Ordering::SeqCst);
                        Ok::<u32, RequestError>(1)
                    }
                })
                .await
        })
    });
    let sends: Vec<_> = sends.collect();
    let started = std::time::Instant::now();
    while held.now.load(Ordering::SeqCst) < MAX_IN_FLIGHT as u32 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the sends never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        held.most.load(Ordering::SeqCst),
        MAX_IN_FLIGHT as u32,
        "no more than the cap is in flight"
    );
    // A control request (a /stop's answer) is not behind the held ones.
    let control = {
        let held = held.clone();
        delivery.call_with(CHAT, Idempotence::Unsafe, Priority::Control, move |_| {
            let held = held.clone();
            async move {
                held.control_ran.store(true, Ordering::SeqCst);
                Ok::<u32, RequestError>(2)
            }
        })
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), control)
        .await
        .expect("the control request is not held behind the cap");
    assert_eq!(answer.expect("sent"), Some(2));
    assert!(held.control_ran.load(Ordering::SeqCst));
    release.add_permits(1000);
    for send in sends {
        let answer = tokio::time::timeout(Duration::from_secs(10), send)
            .await
            .expect("every held send finishes once released")
            .expect("no panic");
        assert_eq!(answer.expect("sent"), Some(1));
    }
    assert_eq!(held.most.load(Ordering::SeqCst), MAX_IN_FLIGHT as u32);
}
