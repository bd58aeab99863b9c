//! The slurmrestd client: one per Controller, plain HTTP to slurmrestd's Service, a JWT per
//! request, the newest data parser the server offers of those the host reads, and a deadline on
//! every call. It keeps no cache: what it returns is what slurmctld said just now.

use std::{sync::Mutex, time::Duration};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client as HttpClient, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    Error,
    jwt::Tokens,
    reservation::{Reservation, ReservationRequest},
};

/// The data-parser versions the host reads, newest first (Slinky's images serve these).
pub const VERSIONS: [&str; 3] = ["v0.0.43", "v0.0.42", "v0.0.41"];

/// The default deadline of one call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// One slurmctld as `ping` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Ping {
    /// The slurmctld's host name (its pod's hostname).
    pub hostname: String,
    /// `UP` or `DOWN`.
    #[serde(default)]
    pub pinged: String,
    /// `primary`, `backup`, `backup2`, …: its place in `SlurmctldHost` order, not whether it is
    /// in control (Slurm's data parser derives it from the position).
    #[serde(default)]
    pub mode: String,
}

impl Ping {
    /// It answered the ping.
    pub fn is_up(&self) -> bool {
        self.pinged.eq_ignore_ascii_case("UP")
    }
}

/// The slurmctld in control: the first in `SlurmctldHost` order that answers (the primary
/// while it is up, else the backup that took over). `ping` lists them in that order.
pub fn in_control(pings: &[Ping]) -> Option<&Ping> {
    pings.iter().find(|p| p.is_up())
}

/// A slurmrestd client.
pub struct Client {
    base: String,
    tokens: Tokens,
    timeout: Duration,
    http: HttpClient<HttpConnector, Full<Bytes>>,
    /// The data parser agreed with the server (`None` until the first call, or after a 404).
    version: Mutex<Option<&'static str>>,
    /// Requests sent.
    requests: std::sync::atomic::AtomicU64,
    /// The server takes batched node updates (until it answers one with 404 or 405).
    batches: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("tokens", &self.tokens)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The part of every slurmrestd answer that tells whether it did what was asked.
#[derive(Deserialize, Default)]
struct Outcome {
    #[serde(default)]
    errors: Vec<SlurmError>,
}

#[derive(Deserialize, Default)]
struct SlurmError {
    #[serde(default)]
    description: String,
    #[serde(default)]
    error: String,
}

impl Outcome {
    fn message(&self) -> Option<String> {
        let parts: Vec<String> = self
            .errors
            .iter()
            .map(|e| {
                match (
                    e.description.is_empty(),
                    e.error.is_empty() || e.error == "No error",
                ) {
                    (false, false) => format!("{}: {}", e.description, e.error),
                    (false, true) => e.description.clone(),
                    (true, _) => e.error.clone(),
                }
            })
            .filter(|m| !m.is_empty())
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

impl Client {
    /// A client of the slurmrestd at `base` (`http://host:port`), authenticating with `tokens`,
    /// giving up on any call after `timeout`.
    ///
    /// # Errors
    /// [`Error::Url`] when `base` is not an `http://` URL.
    pub fn new(base: &str, tokens: Tokens, timeout: Duration) -> Result<Client, Error> {
        let base = base.trim_end_matches('/').to_string();
        let uri: http::Uri = base.parse().map_err(|e: http::uri::InvalidUri| Error::Url {
            url: base.clone(),
            why: e.to_string(),
        })?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(Error::Url {
                url: base,
                why: "expected http://HOST[:PORT] (slurmrestd serves plain HTTP inside the cluster)".into(),
            });
        }
        let http = HttpClient::builder(TokioExecutor::new()).build_http();
        Ok(Client {
            base,
            tokens,
            timeout,
            http,
            version: Mutex::new(None),
            requests: std::sync::atomic::AtomicU64::new(0),
            batches: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// The server's URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// How many requests the client has sent.
    pub fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the server takes batched node updates (see [`Client::update_nodes`]).
    pub(crate) fn batches(&self) -> bool {
        self.batches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The server refused a batched node update as unknown: ask node by node from now on.
    pub(crate) fn no_batches(&self) {
        self.batches.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// The tokens the client signs with.
    pub fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// One request, with the deadline; the body read as JSON.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), Error> {
        let url = format!("{}{path}", self.base);
        self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let req = Request::builder()
            .method(method.clone())
            .uri(&url)
            .header("X-SLURM-USER-NAME", self.tokens.user())
            .header("X-SLURM-USER-TOKEN", self.tokens.token())
            .header("Content-Type", "application/json")
            .header("Accept", "application/json")
            .body(Full::new(bytes))
            .map_err(|e| Error::Url {
                url: url.clone(),
                why: e.to_string(),
            })?;
        let call = async {
            let res = self.http.request(req).await.map_err(|e| Error::Unreachable {
                url: self.base.clone(),
                why: error_chain(&e),
            })?;
            let status = res.status();
            let body = res.into_body().collect().await.map_err(|e| Error::Unreachable {
                url: self.base.clone(),
                why: e.to_string(),
            })?;
            Ok::<_, Error>((status, body.to_bytes()))
        };
        let (status, bytes) =
            tokio::time::timeout(self.timeout, call)
                .await
                .map_err(|_| Error::Timeout {
                    url: self.base.clone(),
                    after: self.timeout,
                })??;
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(Error::Unauthorized {
                url: self.base.clone(),
                status: status.as_u16(),
                message: String::new(),
            });
        }
        let value: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Ok((status, value))
    }

    /// The data parser to speak: the newest of [`VERSIONS`] the server answers `ping` on.
    ///
    /// # Errors
    /// The server cannot be reached, or serves none of them.
    pub async fn version(&self) -> Result<&'static str, Error> {
        if let Some(v) = *self
            .version
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            return Ok(v);
        }
        for v in VERSIONS {
            let (status, _) = self
                .request(Method::GET, &format!("/slurm/{v}/ping"), None)
                .await?;
            if status != StatusCode::NOT_FOUND {
                *self
                    .version
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(v);
                return Ok(v);
            }
        }
        Err(Error::NoVersion {
            url: self.base.clone(),
        })
    }

    /// A call in the agreed data parser; a 404 on the version itself renegotiates once (the
    /// server was replaced by another Slurm).
    pub(crate) async fn call(
        &self,
        method: Method,
        what: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Error> {
        let v = self.version().await?;
        let (status, value) = self
            .request(method.clone(), &format!("/slurm/{v}{path}"), body)
            .await?;
        let outcome: Outcome = serde_json::from_value(value.clone()).unwrap_or_default();
        if let Some(message) = outcome.message() {
            // slurmctld refusing the token comes back as an error of the call, not a 401.
            if message.to_ascii_lowercase().contains("authentication") {
                return Err(Error::Unauthorized {
                    url: self.base.clone(),
                    status: status.as_u16(),
                    message: format!(": {message}"),
                });
            }
            return Err(Error::Slurm {
                what: what.to_string(),
                message,
            });
        }
        if status == StatusCode::NOT_MODIFIED {
            // Only a read with `update_time` gets it: nothing changed since.
            return Ok(Value::Null);
        }
        if status == StatusCode::NOT_FOUND && value.get("meta").is_none() {
            *self
                .version
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
        if !status.is_success() {
            return Err(Error::Http {
                what: what.to_string(),
                status: status.as_u16(),
                body: truncate(&value.to_string(), 300),
            });
        }
        Ok(value)
    }

    /// Every slurmctld and whether it is the primary (`GET /slurm/<v>/ping`).
    ///
    /// # Errors
    /// The call failed, or its answer is not a ping list.
    pub async fn ping(&self) -> Result<Vec<Ping>, Error> {
        let value = self.call(Method::GET, "ping", "/ping", None).await?;
        parse(&value, "pings", "ping")
    }

    /// Every job (`GET /slurm/<v>/jobs`).
    ///
    /// # Errors
    /// The call failed, or its answer is not a job list.
    pub async fn jobs(&self) -> Result<Vec<crate::Job>, Error> {
        let value = self.call(Method::GET, "the job list", "/jobs", None).await?;
        parse(&value, "jobs", "jobs")
    }
}

/// The data parser that can create and update reservations (v0.0.41 and v0.0.42 only list and
/// delete them).
pub const RESERVATION_WRITE_VERSION: &str = "v0.0.43";

impl Client {
    /// Every reservation (`GET /slurm/<v>/reservations/`).
    ///
    /// # Errors
    /// The call failed, or its answer is not a reservation list.
    pub async fn reservations(&self) -> Result<Vec<Reservation>, Error> {
        let value = self
            .call(Method::GET, "the reservation list", "/reservations/", None)
            .await?;
        parse(&value, "reservations", "reservations")
    }

    /// The reservation named `name` (Slurm compares names without case), if it exists.
    ///
    /// # Errors
    /// As [`Client::reservations`].
    pub async fn reservation(&self, name: &str) -> Result<Option<Reservation>, Error> {
        Ok(self
            .reservations()
            .await?
            .into_iter()
            .find(|r| r.name.eq_ignore_ascii_case(name)))
    }

    /// Create the reservation `req` names, or update it if it exists
    /// (`POST /slurm/v0.0.43/reservation`).
    ///
    /// # Errors
    /// The server speaks an older data parser ([`Error::Unsupported`]), the call failed, or
    /// Slurm refused it.
    pub async fn put_reservation(&self, req: &ReservationRequest) -> Result<(), Error> {
        let v = self.version().await?;
        if v != RESERVATION_WRITE_VERSION {
            return Err(Error::Unsupported {
                url: self.base.clone(),
                version: v,
                what: "create or update a reservation".into(),
                needs: RESERVATION_WRITE_VERSION,
            });
        }
        self.call(
            Method::POST,
            &format!("writing reservation {}", req.name),
            "/reservation",
            Some(&req.body()),
        )
        .await
        .map(drop)
    }

    /// Delete the reservation `name` (`DELETE /slurm/<v>/reservation/<name>`).
    ///
    /// # Errors
    /// The call failed or Slurm refused it.
    pub async fn delete_reservation(&self, name: &str) -> Result<(), Error> {
        self.call(
            Method::DELETE,
            &format!("deleting reservation {name}"),
            &format!("/reservation/{name}"),
            None,
        )
        .await
        .map(drop)
    }
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    value: &Value,
    field: &str,
    what: &str,
) -> Result<Vec<T>, Error> {
    let list = value.get(field).cloned().ok_or_else(|| Error::Parse {
        what: what.to_string(),
        why: format!("no `{field}` in the answer"),
    })?;
    serde_json::from_value(list).map_err(|e| Error::Parse {
        what: what.to_string(),
        why: e.to_string(),
    })
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// An error and its sources, `: `-joined (hyper's top-level message alone says "client error").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
