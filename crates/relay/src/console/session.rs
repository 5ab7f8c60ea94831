//! Console sign-ins: a session per sign-in, held by the node, named by a random cookie.
//!
//! - The cookie carries only the session's id (32 random bytes), `HttpOnly` and
//!   `SameSite=Strict`. Over TLS (a proxy in front says so with `X-Forwarded-Proto:
//!   https`) it is `__Host-ankusa_console`: `Secure`, `Path=/`, no `Domain`, so no other host
//!   or plain-HTTP page of the site can set or read it; over plain HTTP (a local node) it is
//!   `ankusa_console` on `Path=/ui`.
//! - The session holds the token signed in with; the console's calls to the API carry it,
//!   so a session sees exactly what its token sees now (its scope is read again at every
//!   request). It ends `session_ttl_ms` after its last use, `session_max_ms` after the
//!   sign-in however often it is used, at sign-out, or when the token no longer
//!   authenticates (a reload removed it, or made it a backup or metrics token).
//! - Each session has a CSRF token that every form that changes anything carries.
//! - At most `max_sessions`: a sign-in past it is refused (expired sessions are dropped
//!   first), and tenant-scoped tokens hold at most nine tenths of them (the rest stays for
//!   admin tokens); `ankusa_console_sessions` counts them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The session cookie's name over plain HTTP.
pub const COOKIE: &str = "ankusa_console";
/// Its name over TLS: the browser keeps it only if `Secure`, `Path=/` and host-only.
pub const HOST_COOKIE: &str = "__Host-ankusa_console";

/// One sign-in.
#[derive(Clone, Debug)]
pub struct Session {
    /// The bearer token the console's API calls carry.
    pub credential: String,
    /// The token's name (shown, and in the audit trail through the API).
    pub name: String,
    pub admin: bool,
    pub csrf: String,
    last_used: Instant,
    signed_in: Instant,
}

/// The node's sessions, by the SHA-256 of their id.
#[derive(Debug)]
pub struct Sessions {
    map: Mutex<HashMap<[u8; 32], Session>>,
    ttl: Duration,
    /// The longest a session lives from its sign-in, used or not.
    max_age: Duration,
    max: usize,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

/// The sessions are at their ceiling.
#[derive(Debug)]
pub struct Full;

pub fn random_token() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    pub fn new(ttl: Duration, max: usize, gauge: prometheus_client::metrics::gauge::Gauge) -> Self {
        Sessions {
            map: Mutex::new(HashMap::new()),
            ttl,
            max_age: Duration::from_secs(12 * 3600),
            max,
            gauge,
        }
    }

    /// Sessions that end `max_age` after their sign-in however often they are used.
    pub fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    fn live(&self, s: &Session, now: Instant) -> bool {
        now.duration_since(s.last_used) < self.ttl && now.duration_since(s.signed_in) < self.max_age
    }

    /// A new session for `credential`; its id (the cookie's value).
    pub fn create(&self, credential: String, name: String, admin: bool) -> Result<String, Full> {
        let now = Instant::now();
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= self.max {
            m.retain(|_, s| self.live(s, now));
        }
        // A tenth of the sessions (at least one, of two or more) stays for admin tokens:
        // tenant tokens signing in again and again cannot keep the operators out.
        let reserve = if self.max >= 2 {
            (self.max / 10).max(1)
        } else {
            0
        };
        let tenants = m.values().filter(|s| !s.admin).count();
        if m.len() >= self.max || (!admin && tenants >= self.max - reserve) {
            self.gauge.set(m.len() as i64);
            return Err(Full);
        }
        let id = random_token();
        m.insert(
            digest(&id),
            Session {
                credential,
                name,
                admin,
                csrf: random_token(),
                last_used: now,
                signed_in: now,
            },
        );
        self.gauge.set(m.len() as i64);
        Ok(id)
    }

    /// The live session `id` names (its last use now), if any; an expired one goes.
    pub fn get(&self, id: &str) -> Option<Session> {
        let now = Instant::now();
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let key = digest(id);
        let live = m.get(&key).map(|s| self.live(s, now));
        match m.get_mut(&key) {
            Some(s) if live == Some(true) => {
                s.last_used = now;
                Some(s.clone())
            }
            Some(_) => {
                m.remove(&key);
                self.gauge.set(m.len() as i64);
                None
            }
            None => None,
        }
    }

    /// Ends session `id`.
    pub fn remove(&self, id: &str) {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        m.remove(&digest(id));
        self.gauge.set(m.len() as i64);
    }
}

/// Whether a form's CSRF token is the expected one (constant time).
pub fn csrf_ok(expected: &str, given: &str) -> bool {
    bool::from(digest(expected).ct_eq(&digest(given)))
}

/// The CSRF token of a portal page: bound to its credential (the portal keeps no session).
pub fn portal_csrf(credential: &str) -> String {
    let d = Sha256::digest(format!("ankusa-console-csrf\0{credential}").as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(d)
}

/// The session cookie's value in a request's `Cookie` headers: the `__Host-` one of a TLS
/// sign-in first.
pub fn cookie_of(headers: &axum::http::HeaderMap) -> Option<String> {
    let pairs = || {
        headers
            .get_all(axum::http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|kv| kv.trim().split_once('='))
    };
    [HOST_COOKIE, COOKIE]
        .iter()
        .find_map(|name| pairs().find(|(k, _)| k == name).map(|(_, v)| v.to_owned()))
}

/// The `Set-Cookie` value of a new session (or, with `None`, one that ends it): the
/// `__Host-` cookie over TLS, the plain one on `/ui` otherwise.
pub fn set_cookie(id: Option<&str>, ttl: Duration, secure: bool) -> String {
    let (name, attrs) = if secure {
        (HOST_COOKIE, "Path=/; HttpOnly; SameSite=Strict; Secure")
    } else {
        (COOKIE, "Path=/ui; HttpOnly; SameSite=Strict")
    };
    match id {
        Some(id) => format!("{name}={id}; {attrs}; Max-Age={}", ttl.as_secs()),
        None => format!("{name}=; {attrs}; Max-Age=0"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_bounded_expire_and_end() {
        let g = prometheus_client::metrics::gauge::Gauge::default();
        let s = Sessions::new(Duration::from_millis(50), 2, g.clone());
        let a = s.create("t".into(), "ops".into(), true).unwrap();
        let b = s.create("t".into(), "ops".into(), true).unwrap();
        assert!(
            s.create("t".into(), "ops".into(), true).is_err(),
            "the ceiling refuses"
        );
        assert_eq!(g.get(), 2);
        assert_eq!(s.get(&a).unwrap().name, "ops");
        assert!(s.get("not-a-session").is_none());
        s.remove(&a);
        assert!(s.get(&a).is_none());
        std::thread::sleep(Duration::from_millis(60));
        // Expired sessions make room: `b` goes when the ceiling is met.
        let c = s.create("t".into(), "ops".into(), false).unwrap();
        let d = s.create("t".into(), "ops".into(), true).unwrap();
        assert!(!s.get(&c).unwrap().admin && s.get(&d).is_some());
        assert!(s.get(&b).is_none());
        assert_eq!(g.get(), 2);
    }

    /// A session ends its max age after the sign-in, however often it is used.
    #[test]
    fn a_session_in_use_ends_at_its_max_age() {
        let g = prometheus_client::metrics::gauge::Gauge::default();
        let s =
            Sessions::new(Duration::from_secs(60), 2, g).with_max_age(Duration::from_millis(120));
        let a = s.create("t".into(), "ops".into(), true).unwrap();
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(30));
            assert!(s.get(&a).is_some(), "used within its idle time");
        }
        std::thread::sleep(Duration::from_millis(60));
        assert!(s.get(&a).is_none(), "past its max age");
    }

    /// Tenant tokens cannot fill the sessions: the last tenth (at least one) stays for
    /// admin tokens.
    #[test]
    fn tenant_sessions_leave_room_for_admins() {
        let g = prometheus_client::metrics::gauge::Gauge::default();
        let s = Sessions::new(Duration::from_secs(60), 3, g);
        s.create("a".into(), "team".into(), false).unwrap();
        s.create("a".into(), "team".into(), false).unwrap();
        assert!(
            s.create("a".into(), "team".into(), false).is_err(),
            "a third tenant session"
        );
        s.create("o".into(), "ops".into(), true).unwrap();
        assert!(s.create("o".into(), "ops".into(), true).is_err(), "full");
        // Ten slots: nine for tenants, the tenth for an admin.
        let s = Sessions::new(
            Duration::from_secs(60),
            10,
            prometheus_client::metrics::gauge::Gauge::default(),
        );
        for _ in 0..9 {
            s.create("a".into(), "team".into(), false).unwrap();
        }
        assert!(s.create("a".into(), "team".into(), false).is_err());
        s.create("o".into(), "ops".into(), true).unwrap();
    }

    #[test]
    fn the_cookie_is_http_only_same_site_strict_and_secure_over_tls() {
        let c = set_cookie(Some("abc"), Duration::from_secs(60), true);
        for part in [
            "__Host-ankusa_console=abc",
            "HttpOnly",
            "SameSite=Strict",
            "Secure",
            "Path=/;",
        ] {
            assert!(c.contains(part), "{c}");
        }
        assert!(!c.contains("Domain"), "{c}");
        let plain = set_cookie(Some("abc"), Duration::from_secs(60), false);
        assert!(!plain.contains("Secure") && plain.starts_with("ankusa_console=abc; Path=/ui;"));
        let mut h = axum::http::HeaderMap::new();
        h.insert("cookie", "x=1; ankusa_console=abc; y=2".parse().unwrap());
        assert_eq!(cookie_of(&h).as_deref(), Some("abc"));
        h.insert(
            "cookie",
            "ankusa_console=plain; __Host-ankusa_console=tls"
                .parse()
                .unwrap(),
        );
        assert_eq!(cookie_of(&h).as_deref(), Some("tls"));
        assert!(csrf_ok("tok", "tok") && !csrf_ok("tok", "tok2"));
    }
}
