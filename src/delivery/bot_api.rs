//! The HTTP client of telegate's own Bot API requests ([`BotApi::post`]:
//! sends, edits, `getUpdates`, the `getMe` probe).
//!
//! Why a client of its own: every answer a turn sends is one of these
//! requests, and reqwest's per-request layers (its redirect and retry
//! services, the URL parsed again and printed back into a `Uri`, a
//! response wrapper) cost about a third of the client's CPU per request
//! (19-20 us against 13 us for hyper's pooled client, 50 requests at a
//! time on this project's 2-core machine). [`Transport::Direct`] is
//! hyper's pooled client with rustls and the same Mozilla roots reqwest
//! uses, HTTP/1.1, a 5 s connect timeout and a whole-request timeout
//! (teloxide's 17 s unless set). Where the environment names a proxy
//! (`TELOXIDE_PROXY`, which teloxide's client honours, or the
//! `HTTPS_PROXY` family reqwest honours) the requests keep going through
//! the bot's own reqwest client ([`Transport::BotClient`]), proxy and
//! all: [`proxy_named`] decides, once, when the handle is made.
//!
//! What a failure means is kept apart by where it happened: a connection
//! that could not be made ([`AttemptError::NotSent`]: nothing left, safe
//! to try again) against a request that was written and got no readable
//! answer ([`AttemptError::Unanswered`]: timed out, hung up on, an answer
//! too large: it may have been carried out). An answer is read whole up to
//! [`MAX_ANSWER_BYTES`].
//!
//! This module owns the transport of these requests; their wire format is
//! [`super::api`]'s. It never logs, and never puts the request's URL (it
//! holds the token) in an error.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::de::DeserializeOwned;
use serde::Serialize;
use teloxide::requests::Payload;
use teloxide::{Bot, RequestError};

use super::api::{read_answer, AttemptError};

/// The longest answer read (`getUpdates` with 100 updates is far below).
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// teloxide's client timeouts (`teloxide::net::default_reqwest_settings`),
/// kept for the direct client: a whole request, and making a connection.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(17);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an unused connection is kept (reqwest's default).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The variables naming a proxy for telegate's requests: teloxide's own,
/// and those reqwest reads for an `https` or `http` API URL.
const PROXY_VARIABLES: [&str; 7] = [
    "TELOXIDE_PROXY",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// Whether `var` (the environment, in use) names a proxy for the Bot API.
pub fn proxy_named(var: impl Fn(&str) -> Option<OsString>) -> bool {
    PROXY_VARIABLES
        .iter()
        .any(|name| var(name).is_some_and(|value| !value.is_empty()))
}

/// How the requests travel.
#[derive(Clone)]
enum Transport {
    /// hyper's pooled client (see the module documentation).
    Direct {
        client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
        timeout: Duration,
    },
    /// The bot's reqwest client (its proxy, its timeouts).
    BotClient,
}

/// The requests' client for one bot: cheap to clone (the connections are
/// shared).
#[derive(Clone)]
pub struct BotApi {
    bot: Bot,
    /// `<api_url>/bot<token>/`: a method's URL is this and its name.
    base: Arc<str>,
    transport: Transport,
}

impl BotApi {
    /// `bot`'s requests: direct, unless the environment names a proxy.
    pub fn new(bot: Bot) -> BotApi {
        if proxy_named(|name| std::env::var_os(name)) {
            BotApi::through_bot_client(bot)
        } else {
            BotApi::direct(bot)
        }
    }

    /// `bot`'s requests through hyper's pooled client.
    pub fn direct(bot: Bot) -> BotApi {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let tls = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider());
        let Ok(tls) = tls else {
            // ring's default protocol versions are always there; should
            // they not be, the bot's own client still works.
            return BotApi::through_bot_client(bot);
        };
        let connector = tls.https_or_http().enable_http1().wrap_connector(http);
        // Idle connections are closed after reqwest's 90 s, by a timer
        // (without one they would be dropped only when next taken).
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(connector);
        BotApi {
            base: method_base(&bot),
            bot,
            transport: Transport::Direct {
                client,
                timeout: REQUEST_TIMEOUT,
            },
        }
    }

    /// `bot`'s requests through its own reqwest client.
    pub fn through_bot_client(bot: Bot) -> BotApi {
        BotApi {
            base: method_base(&bot),
            bot,
            transport: Transport::BotClient,
        }
    }

    /// The same, with the direct client's whole-request timeout `timeout`
    /// (the bot's own client keeps its own).
    pub fn with_timeout(mut self, timeout: Duration) -> BotApi {
        if let Transport::Direct { timeout: t, .. } = &mut self.transport {
            *t = timeout;
        }
        self
    }

    /// Whether requests go through hyper's client (not the bot's).
    pub fn is_direct(&self) -> bool {
        matches!(self.transport, Transport::Direct { .. })
    }

    /// The bot the requests are made for.
    pub fn bot(&self) -> &Bot {
        &self.bot
    }

    /// `payload` as a JSON request. A 5xx is [`AttemptError::Server`] at
    /// once; every other answer is read the way teloxide reads it.
    pub async fn post<P>(self, payload: P) -> Result<P::Output, AttemptError>
    where
        P: Payload + Serialize,
        P::Output: DeserializeOwned,
    {
        let body = serde_json::to_vec(&payload).map_err(invalid_input)?;
        let uri = format!("{}{}", self.base, P::NAME);
        match self.transport {
            Transport::Direct { client, timeout } => {
                let text = match tokio::time::timeout(timeout, direct(&client, &uri, body)).await {
                    Ok(answer) => answer?,
                    Err(_) => {
                        return Err(AttemptError::Unanswered(format!(
                            "no answer from Telegram within {} s",
                            timeout.as_secs_f32()
                        )))
                    }
                };
                read_answer(&text).map_err(AttemptError::Request)
            }
            Transport::BotClient => through_reqwest::<P>(&self.bot, &uri, body).await,
        }
    }
}

/// `<api_url>/bot<token>/`, as teloxide builds a method's URL (its path
/// segments escaped) without the method.
fn method_base(bot: &Bot) -> Arc<str> {
    let mut url = bot.api_url();
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.push(&format!("bot{}", bot.token()));
    }
    // (An API URL that cannot take a path is refused at load: an http(s)
    // URL with a host.) Pushing the method would add `/` and its name.
    format!("{url}/").into()
}

/// One request through hyper's client: the answer's text, a 5xx as
/// [`AttemptError::Server`].
async fn direct(
    client: &Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    uri: &str,
    body: Vec<u8>,
) -> Result<String, AttemptError> {
    let request = hyper::Request::post(uri)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|_| invalid_input("telegram.api_url does not make a request URL"))?;
    let response = client.request(request).await.map_err(|error| {
        if error.is_connect() {
            AttemptError::NotSent(format!(
                "could not connect to Telegram: {}",
                source_of(&error)
            ))
        } else {
            AttemptError::Unanswered(format!("no answer from Telegram: {}", source_of(&error)))
        }
    })?;
    let status = response.status();
    if status.is_server_error() {
        return Err(AttemptError::Server(status.as_u16()));
    }
    let bytes = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|error| AttemptError::Unanswered(format!("the answer was cut off: {error}")))?
        .to_bytes();
    String::from_utf8(bytes.into())
        .map_err(|_| AttemptError::Unanswered("the answer was not text".into()))
}

/// A request that cannot be made from what it was given (nothing sent).
fn invalid_input(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> RequestError {
    RequestError::Io(Arc::new(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        error,
    )))
}

/// The innermost cause of `error` (hyper's own message is "client error
/// (Connect)" and the like).
fn source_of(error: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = error;
    while let Some(source) = inner.source() {
        inner = source;
    }
    inner.to_string()
}

/// One request through the bot's own reqwest client.
async fn through_reqwest<P>(bot: &Bot, uri: &str, body: Vec<u8>) -> Result<P::Output, AttemptError>
where
    P: Payload,
    P::Output: DeserializeOwned,
{
    let url = reqwest::Url::parse(uri)
        .map_err(|_| invalid_input("telegram.api_url does not make a request URL"))?;
    let response = bot
        .client()
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(RequestError::from)?;
    let status = response.status();
    if status.is_server_error() {
        return Err(AttemptError::Server(status.as_u16()));
    }
    let text = response.text().await.map_err(RequestError::from)?;
    read_answer(&text).map_err(AttemptError::Request)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use teloxide::Bot;

    use super::{method_base, proxy_named, BotApi};

    #[test]
    fn a_proxy_in_the_environment_keeps_the_bots_own_client() {
        let env = |set: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                set.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| OsString::from(*v))
            }
        };
        assert!(!proxy_named(env(&[])));
        assert!(!proxy_named(env(&[("NO_PROXY", "*"), ("HTTPS_PROXY", "")])));
        for name in [
            "TELOXIDE_PROXY",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "http_proxy",
        ] {
            let set: &'static [(&'static str, &'static str)] =
                Box::leak(vec![(name, "http://proxy:3128")].into_boxed_slice());
            assert!(proxy_named(env(set)), "{name}");
        }
    }

    #[test]
    fn a_methods_url_is_the_one_teloxide_makes() {
        for api in [
            "https://api.telegram.org",
            "https://api.telegram.org/",
            "http://127.0.0.1:8081/",
            "http://127.0.0.1:8081/prefix",
            "http://127.0.0.1:8081/prefix/",
        ] {
            let bot = Bot::new("123:abc").set_api_url(api.parse().expect("a URL"));
            let mut teloxide = bot.api_url();
            teloxide
                .path_segments_mut()
                .expect("a base")
                .push("bot123:abc")
                .push("sendMessage");
            assert_eq!(
                format!("{}sendMessage", method_base(&bot)),
                teloxide.as_str(),
                "{api}"
            );
        }
    }

    #[tokio::test]
    async fn https_and_http_urls_both_get_the_direct_client() {
        for api in ["https://api.telegram.org", "http://127.0.0.1:8081"] {
            let bot = Bot::new("123:abc").set_api_url(api.parse().expect("a URL"));
            assert!(BotApi::direct(bot.clone()).is_direct());
            assert!(!BotApi::through_bot_client(bot).is_direct());
        }
    }
}
