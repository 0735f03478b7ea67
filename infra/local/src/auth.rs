//! The local runner's authorizers: what API Gateway does for a deployed stack, done in
//! process, so the same requests authenticate the same way on `sas-local`.
//!
//! - [`LocalAuth::Iam`] checks a SigV4 signature (service `execute-api`) against a set of local
//!   access keys, each naming its principal ARN: the signature is recomputed with `aws-sigv4`
//!   over exactly the headers the client signed, at the client's `X-Amz-Date` (at most 15
//!   minutes off), and compared.
//! - [`LocalAuth::Jwt`] checks a bearer JWT as an HTTP API JWT authorizer does: its signature
//!   against the issuer's JWKS (by `kid`), `iss`, `aud` (or `client_id`), `exp`, `nbf`, and the
//!   route's scopes (`scope`, space-separated) if the route has any.
//! - [`TestIssuer`] is a local issuer with a fresh ES256 key pair, for tests and the quickstart:
//!   its JWKS for the runner, and tokens for the callers.

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use base64::Engine;
use chrono::{DateTime, NaiveDateTime, Utc};
use http::{HeaderMap, Method};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use sas::auth::Identity;
use sas::domain::Caller;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// The longest a SigV4 signature's time may be off the runner's clock.
pub const MAX_SKEW_SECONDS: i64 = 15 * 60;

/// How the local runner authenticates one API's requests.
#[derive(Clone, Default)]
pub enum LocalAuth {
    /// Every request is the caller `anonymous`.
    #[default]
    None,
    Iam(Arc<SigV4Check>),
    Jwt(Arc<JwtCheck>),
    /// No request is authenticated (an API given no credentials while another needs them).
    Closed(&'static str),
}

impl std::fmt::Debug for LocalAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::None => "None",
            Self::Iam(_) => "Iam",
            Self::Jwt(_) => "Jwt",
            Self::Closed(_) => "Closed",
        })
    }
}

impl LocalAuth {
    /// The operator API's authorizer when the task API uses `api`: `operator` as given, except
    /// that an operator API without credentials behind an authenticated task API is closed (its
    /// routes act on every caller's tasks; no credentials given means none will do).
    pub fn for_operator(api: &LocalAuth, operator: LocalAuth) -> LocalAuth {
        match (api, operator) {
            (LocalAuth::None, operator) => operator,
            (_, LocalAuth::None) => LocalAuth::Closed(
                "the operator API needs SigV4 with local users (--users) when the task API authenticates",
            ),
            (_, operator) => operator,
        }
    }

    /// The identity of a request: `uri` is its absolute URI as the client addressed it (the
    /// `Host` header gives the authority when the URI has none).
    pub fn identify(
        &self,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Identity {
        let result = match self {
            Self::None => return Identity::anonymous(),
            Self::Closed(why) => return Identity::Unauthenticated((*why).to_owned()),
            Self::Iam(check) => check.verify(method, path_and_query, headers, body, Utc::now()),
            Self::Jwt(check) => check.verify(method, path_and_query, headers),
        };
        match result {
            Ok(caller) => Identity::Caller(caller),
            Err(why) => Identity::Unauthenticated(why),
        }
    }
}

/// A local IAM user: an access key, its secret, and the principal it stands for.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalUser {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// The principal ARN requests signed with this key are from.
    pub arn: String,
}

impl std::fmt::Debug for LocalUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalUser")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"***")
            .field("arn", &self.arn)
            .finish()
    }
}

/// SigV4 verification against local access keys, for the service `execute-api` in whatever
/// region the client signed for (the local runner has no region of its own).
pub struct SigV4Check {
    users: HashMap<String, (String, Caller)>,
}

/// Why a bearer token is refused, in the caller's terms (not the decoder's: a malformed token
/// is "not a JWT", not a base64 error at an offset).
fn token_error(e: jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    let why = match e.kind() {
        K::InvalidToken | K::Base64(_) | K::Json(_) | K::Utf8(_) => {
            "not a JWT (three base64url parts: header.payload.signature)".to_owned()
        }
        K::ExpiredSignature => "expired (exp)".to_owned(),
        K::ImmatureSignature => "not valid yet (nbf)".to_owned(),
        K::InvalidSignature => {
            "the signature does not match (another key signed it, or it was changed)".to_owned()
        }
        K::InvalidIssuer => "from another issuer (iss)".to_owned(),
        K::InvalidAudience => "for another audience (aud)".to_owned(),
        K::InvalidAlgorithm | K::InvalidAlgorithmName => "signed with another algorithm".to_owned(),
        K::MissingRequiredClaim(c) => format!("it has no {c} claim"),
        _ => e.to_string(),
    };
    format!("token: {why}")
}

/// The request's `Authorization` header, as text.
fn authorization(headers: &HeaderMap) -> Result<&str, &'static str> {
    headers
        .get(http::header::AUTHORIZATION)
        .ok_or("no Authorization header")?
        .to_str()
        .map_err(|_| "Authorization is not visible ASCII")
}

/// The parts of an `Authorization: AWS4-HMAC-SHA256 ...` header.
struct Authorization<'a> {
    access_key: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

fn parse_authorization(value: &str) -> Option<Authorization<'_>> {
    let rest = value.strip_prefix("AWS4-HMAC-SHA256 ")?;
    let mut credential = None;
    let mut signed = None;
    let mut signature = None;
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        match k {
            "Credential" => credential = Some(v),
            "SignedHeaders" => signed = Some(v),
            "Signature" => signature = Some(v),
            _ => return None,
        }
    }
    let mut scope = credential?.split('/');
    let auth = Authorization {
        access_key: scope.next()?,
        date: scope.next()?,
        region: scope.next()?,
        service: scope.next()?,
        signed_headers: signed?.split(';').collect(),
        signature: signature?,
    };
    (scope.next()? == "aws4_request" && scope.next().is_none()).then_some(auth)
}

impl SigV4Check {
    pub fn new(users: Vec<LocalUser>) -> Result<Self, String> {
        let mut map = HashMap::new();
        for u in users {
            let caller =
                Caller::from_iam_arn(&u.arn).map_err(|e| format!("user {}: {e}", u.arn))?;
            map.insert(u.access_key_id, (u.secret_access_key, caller));
        }
        Ok(Self { users: map })
    }

    /// Reads users from a JSON file: `[{"accessKeyId", "secretAccessKey", "arn"}]`.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let users: Vec<LocalUser> = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not a list of users: {e}", path.display()))?;
        Self::new(users).map_err(anyhow::Error::msg)
    }

    pub fn verify(
        &self,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Caller, String> {
        let value = authorization(headers)?;
        let auth = parse_authorization(value).ok_or("not a SigV4 Authorization header")?;
        if auth.service != "execute-api" {
            return Err(format!(
                "signed for the service {:?}, not execute-api",
                auth.service
            ));
        }
        let (secret, caller) = self.users.get(auth.access_key).ok_or_else(|| {
            format!(
                "unknown access key {:?}: not in the local users file",
                auth.access_key
            )
        })?;
        let amz_date = headers
            .get("x-amz-date")
            .and_then(|v| v.to_str().ok())
            .ok_or("no X-Amz-Date header")?;
        let time = NaiveDateTime::parse_from_str(amz_date, "%Y%m%dT%H%M%SZ")
            .map_err(|_| "X-Amz-Date is not YYYYMMDDTHHMMSSZ")?
            .and_utc();
        if !amz_date.starts_with(auth.date) {
            return Err("the credential scope's date is not X-Amz-Date's".into());
        }
        if (now - time).num_seconds().abs() > MAX_SKEW_SECONDS {
            return Err("the signature's time is more than 15 minutes off".into());
        }
        if !auth.signed_headers.contains(&"host") {
            return Err("the Host header is not signed".into());
        }
        let host = headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .ok_or("no Host header")?;
        let token = headers
            .get("x-amz-security-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Exactly the headers the client signed; aws-sigv4 adds the date and token itself.
        let mut signed: Vec<(&str, &str)> = Vec::new();
        for name in &auth.signed_headers {
            if matches!(*name, "x-amz-date" | "x-amz-security-token") {
                continue;
            }
            let mut values = headers.get_all(*name).iter();
            let v = values
                .next()
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| format!("signed header {name} is missing"))?;
            if values.next().is_some() {
                return Err(format!("signed header {name} is repeated"));
            }
            signed.push((name, v));
        }
        let identity =
            Credentials::new(auth.access_key, secret.clone(), token, None, "sas-local").into();
        let mut settings = SigningSettings::default();
        settings.excluded_headers = Some(Vec::new());
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(auth.region)
            .name("execute-api")
            .time(time.into())
            .settings(settings)
            .build()
            .map_err(|e| format!("signing parameters: {e}"))?
            .into();
        let uri = format!("http://{host}{path_and_query}");
        let request = SignableRequest::new(
            method.as_str(),
            &uri,
            signed.into_iter(),
            SignableBody::Bytes(body),
        )
        .map_err(|e| format!("request cannot be signed: {e}"))?;
        let (_, expected) = sign(request, &params)
            .map_err(|e| format!("request cannot be signed: {e}"))?
            .into_parts();
        if aws_lc_rs::constant_time::verify_slices_are_equal(
            expected.as_bytes(),
            auth.signature.as_bytes(),
        )
        .is_err()
        {
            return Err(format!(
                "the signature does not match (signed for region {}): check the secret key",
                auth.region
            ));
        }
        Ok(caller.clone())
    }
}

/// JWT verification as an HTTP API JWT authorizer does it.
pub struct JwtCheck {
    issuer: String,
    audience: Vec<String>,
    keys: JwkSet,
    /// Scopes a route needs (any one of them), by route kind; none: no scope needed.
    write_scopes: Vec<String>,
    read_scopes: Vec<String>,
}

#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
    client_id: Option<String>,
    #[serde(default)]
    scope: Option<String>,
}

impl JwtCheck {
    pub fn new(issuer: impl Into<String>, audience: Vec<String>, keys: JwkSet) -> Self {
        Self {
            issuer: issuer.into(),
            audience,
            keys,
            write_scopes: Vec::new(),
            read_scopes: Vec::new(),
        }
    }

    /// Scopes the routes need: `write` for starting and cancelling tasks, `read` for reading.
    pub fn with_scopes(mut self, write: Vec<String>, read: Vec<String>) -> Self {
        self.write_scopes = write;
        self.read_scopes = read;
        self
    }

    pub fn verify(
        &self,
        method: &Method,
        _path_and_query: &str,
        headers: &HeaderMap,
    ) -> Result<Caller, String> {
        let value = authorization(headers)?;
        // The scheme is case-insensitive (RFC 9110); the token is all that follows one space.
        let token = match value.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token,
            _ => return Err("not a bearer token".into()),
        };
        let header = jsonwebtoken::decode_header(token).map_err(token_error)?;
        let jwk = match header.kid.as_deref() {
            Some(kid) => self.keys.find(kid),
            None => None,
        }
        .ok_or("the token's key (kid) is not the issuer's")?;
        let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("issuer key: {e}"))?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&self.audience);
        validation.set_required_spec_claims(&["exp", "iss"]);
        validation.validate_nbf = true;
        validation.leeway = 0;
        // An access token may name its client in `client_id` instead of `aud` (Cognito): the
        // authorizer accepts either; check `aud` when present, `client_id` otherwise.
        let claims = match jsonwebtoken::decode::<Claims>(token, &key, &validation) {
            Ok(data) => data.claims,
            Err(e) if matches!(e.kind(), jsonwebtoken::errors::ErrorKind::MissingRequiredClaim(c) if c == "aud") =>
            {
                let mut v = validation.clone();
                v.validate_aud = false;
                let data = jsonwebtoken::decode::<Claims>(token, &key, &v).map_err(token_error)?;
                if !data
                    .claims
                    .client_id
                    .as_ref()
                    .is_some_and(|c| self.audience.contains(c))
                {
                    return Err("token: neither aud nor client_id is an allowed audience".into());
                }
                data.claims
            }
            Err(e) => return Err(token_error(e)),
        };
        let needed = if *method == Method::GET {
            &self.read_scopes
        } else {
            &self.write_scopes
        };
        if !needed.is_empty() {
            let granted: Vec<&str> = claims
                .scope
                .as_deref()
                .unwrap_or_default()
                .split(' ')
                .collect();
            if !needed.iter().any(|s| granted.contains(&s.as_str())) {
                return Err(format!("the token has none of the scopes {needed:?}"));
            }
        }
        let sub = claims
            .sub
            .or(claims.client_id)
            .ok_or("the token names no subject")?;
        // As the deployed API: a subject of sas's own callers' form (a schedule's) is refused.
        Caller::principal(sub).map_err(|e| format!("JWT subject: {e}"))
    }
}

/// A local token issuer with a fresh ES256 key pair.
pub struct TestIssuer {
    pub issuer: String,
    pub key_id: String,
    pkcs8: Vec<u8>,
    jwks: JwkSet,
}

impl std::fmt::Debug for TestIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestIssuer")
            .field("issuer", &self.issuer)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// A saved [`TestIssuer`]: the private key (PKCS#8, base64) and its JWKS.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedIssuer {
    issuer: String,
    key_id: String,
    private_key_pkcs8: String,
    jwks: serde_json::Value,
}

impl TestIssuer {
    pub fn generate(issuer: impl Into<String>) -> anyhow::Result<Self> {
        use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
        let pair = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING)
            .map_err(|_| anyhow::anyhow!("cannot generate a key pair"))?;
        let pkcs8 = pair
            .to_pkcs8v1()
            .map_err(|_| anyhow::anyhow!("cannot encode the key pair"))?
            .as_ref()
            .to_vec();
        // The public key is an uncompressed point: 0x04, x (32 bytes), y (32 bytes).
        let point = pair.public_key().as_ref();
        anyhow::ensure!(point.len() == 65 && point[0] == 4, "unexpected public key");
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let key_id = hex::encode(
            &aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, point).as_ref()[..8],
        );
        let jwks: JwkSet = serde_json::from_value(serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": key_id,
            "x": b64.encode(&point[1..33]), "y": b64.encode(&point[33..]),
        }]}))?;
        Ok(Self {
            issuer: issuer.into(),
            key_id,
            pkcs8,
            jwks,
        })
    }

    /// The issuer kept in `path` (a JSON file), made and saved there first if it is absent.
    pub fn load_or_create(path: &Path, issuer: &str) -> anyhow::Result<Self> {
        let b64 = base64::engine::general_purpose::STANDARD;
        if let Ok(text) = std::fs::read_to_string(path) {
            let saved: SavedIssuer = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{} is not a saved issuer: {e}", path.display()))?;
            return Ok(Self {
                issuer: saved.issuer,
                key_id: saved.key_id,
                pkcs8: b64.decode(saved.private_key_pkcs8)?,
                jwks: serde_json::from_value(saved.jwks)?,
            });
        }
        let made = Self::generate(issuer)?;
        let saved = SavedIssuer {
            issuer: made.issuer.clone(),
            key_id: made.key_id.clone(),
            private_key_pkcs8: b64.encode(&made.pkcs8),
            jwks: serde_json::to_value(&made.jwks)?,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&saved)?)?;
        Ok(made)
    }

    pub fn jwks(&self) -> &JwkSet {
        &self.jwks
    }

    /// A signed token for `sub`, for `audience`, valid for `ttl` from `now` (negative: expired).
    pub fn token(
        &self,
        sub: &str,
        audience: &str,
        scopes: &[&str],
        now: DateTime<Utc>,
        ttl: chrono::Duration,
    ) -> anyhow::Result<String> {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.key_id.clone());
        let mut claims = serde_json::json!({
            "iss": self.issuer, "sub": sub, "aud": audience,
            "iat": now.timestamp(), "exp": (now + ttl).timestamp(),
        });
        if !scopes.is_empty() {
            claims["scope"] = serde_json::Value::String(scopes.join(" "));
        }
        Ok(jsonwebtoken::encode(
            &header,
            &claims,
            &EncodingKey::from_ec_der(&self.pkcs8),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(
        user: &LocalUser,
        region: &str,
        method: &str,
        uri: &str,
        body: &[u8],
        at: DateTime<Utc>,
    ) -> HeaderMap {
        let identity = Credentials::new(
            &user.access_key_id,
            &user.secret_access_key,
            None,
            None,
            "t",
        )
        .into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name("execute-api")
            .time(at.into())
            .settings(SigningSettings::default())
            .build()
            .expect("params")
            .into();
        let headers = [("content-type", "application/json")];
        let request =
            SignableRequest::new(method, uri, headers.into_iter(), SignableBody::Bytes(body))
                .expect("signable");
        let (instructions, _) = sign(request, &params).expect("signed").into_parts();
        let mut req = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(())
            .expect("request");
        instructions.apply_to_request_http1x(&mut req);
        let mut map = req.headers().clone();
        map.insert(
            http::header::HOST,
            http::HeaderValue::from_str(req.uri().authority().expect("host").as_str())
                .expect("host"),
        );
        map
    }

    #[test]
    fn sigv4_accepts_the_users_signature_and_nothing_else() {
        let alice = LocalUser {
            access_key_id: "AKIALOCALALICE".into(),
            secret_access_key: "alice-secret".into(),
            arn: "arn:aws:iam::000000000000:user/alice".into(),
        };
        let check = SigV4Check::new(vec![alice.clone()]).expect("check");
        let now = Utc::now();
        let uri = "http://127.0.0.1:8080/workflows/w/tasks?x=1";
        let body = br#"{"a":1}"#;
        let h = signed(&alice, "us-east-1", "POST", uri, body, now);
        let path = "/workflows/w/tasks?x=1";
        assert_eq!(
            check.verify(&Method::POST, path, &h, body, now),
            Ok(Caller::new("arn:aws:iam::000000000000:user/alice").expect("ok"))
        );
        // Any region the client signed for.
        let eu = signed(&alice, "eu-west-1", "POST", uri, body, now);
        assert!(check.verify(&Method::POST, path, &eu, body, now).is_ok());
        // Another body, path, method, a wrong secret, an old signature: refused, saying why.
        assert!(check.verify(&Method::POST, path, &h, b"{}", now).is_err());
        assert!(
            check
                .verify(&Method::POST, "/workflows/v/tasks?x=1", &h, body, now)
                .is_err()
        );
        assert!(check.verify(&Method::PUT, path, &h, body, now).is_err());
        let forged = signed(
            &LocalUser {
                secret_access_key: "guess".into(),
                ..alice.clone()
            },
            "us-east-1",
            "POST",
            uri,
            body,
            now,
        );
        let why = check
            .verify(&Method::POST, path, &forged, body, now)
            .expect_err("a wrong secret");
        assert!(why.contains("the signature does not match"), "{why}");
        let stranger = signed(
            &LocalUser {
                access_key_id: "AKIASTRANGER".into(),
                ..alice.clone()
            },
            "us-east-1",
            "POST",
            uri,
            body,
            now,
        );
        let why = check
            .verify(&Method::POST, path, &stranger, body, now)
            .expect_err("an unknown key");
        assert!(why.contains("unknown access key \"AKIASTRANGER\""), "{why}");
        let old = signed(
            &alice,
            "us-east-1",
            "POST",
            uri,
            body,
            now - chrono::Duration::minutes(20),
        );
        assert!(check.verify(&Method::POST, path, &old, body, now).is_err());
        assert!(
            check
                .verify(&Method::POST, path, &HeaderMap::new(), body, now)
                .is_err()
        );
    }

    #[test]
    fn jwt_accepts_the_issuers_live_tokens_only() {
        let issuer = TestIssuer::generate("https://issuer.local").expect("issuer");
        let check = JwtCheck::new(
            "https://issuer.local",
            vec!["sas".into()],
            issuer.jwks().clone(),
        );
        let bearer = |t: String| {
            let mut h = HeaderMap::new();
            h.insert(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_str(&format!("Bearer {t}")).expect("header"),
            );
            h
        };
        let now = Utc::now();
        let hour = chrono::Duration::hours(1);
        let good = issuer.token("alice", "sas", &[], now, hour).expect("token");
        assert_eq!(
            check.verify(&Method::GET, "/tasks", &bearer(good.clone())),
            Ok(Caller::new("alice").expect("ok"))
        );
        let expired = issuer
            .token("alice", "sas", &[], now, -hour)
            .expect("token");
        assert!(
            check
                .verify(&Method::GET, "/tasks", &bearer(expired))
                .is_err()
        );
        let other_aud = issuer.token("alice", "web", &[], now, hour).expect("token");
        assert!(
            check
                .verify(&Method::GET, "/tasks", &bearer(other_aud))
                .is_err()
        );
        let stranger = TestIssuer::generate("https://issuer.local").expect("issuer");
        let forged = stranger
            .token("alice", "sas", &[], now, hour)
            .expect("token");
        assert!(
            check
                .verify(&Method::GET, "/tasks", &bearer(forged))
                .is_err()
        );
        // A malformed token says so, in the caller's terms.
        for bad in ["abc", "a.b.c", &format!("{}x", &good[..good.len() - 1])] {
            let why = check
                .verify(&Method::GET, "/tasks", &bearer(bad.to_owned()))
                .expect_err("refused");
            assert!(
                why.starts_with("token: not a JWT") || why.starts_with("token: the signature"),
                "{bad}: {why}"
            );
            assert!(!why.contains("Base64"), "{bad}: {why}");
        }
        // A tampered payload breaks the signature.
        let mut parts: Vec<String> = good.split('.').map(str::to_owned).collect();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let payload = String::from_utf8(b64.decode(&parts[1]).expect("b64")).expect("utf8");
        parts[1] = b64.encode(payload.replace("alice", "bobby"));
        assert!(
            check
                .verify(&Method::GET, "/tasks", &bearer(parts.join(".")))
                .is_err()
        );
        // Scopes per route kind.
        let scoped = JwtCheck::new(
            "https://issuer.local",
            vec!["sas".into()],
            issuer.jwks().clone(),
        )
        .with_scopes(vec!["tasks/write".into()], vec![]);
        let reader = issuer
            .token("alice", "sas", &["tasks/read"], now, hour)
            .expect("token");
        assert!(
            scoped
                .verify(&Method::GET, "/tasks", &bearer(reader.clone()))
                .is_ok()
        );
        assert!(
            scoped
                .verify(&Method::POST, "/workflows/w/tasks", &bearer(reader))
                .is_err()
        );
        let writer = issuer
            .token("alice", "sas", &["tasks/write"], now, hour)
            .expect("token");
        assert!(
            scoped
                .verify(&Method::POST, "/workflows/w/tasks", &bearer(writer))
                .is_ok()
        );
    }
}
