//! Who is calling the task API.
//!
//! The API authenticates every request before a handler sees it: in a deployed stack API
//! Gateway's authorizer does (`AWS_IAM` SigV4, or a JWT authorizer), and the handler reads the
//! principal it put in the request context; in `sas-local`, the kit's `sas_local::auth` checks the
//! same credentials itself. The handlers only ever see an [`Identity`].

use crate::domain::Caller;
use aws_lambda_events::apigw::ApiGatewayV2httpRequestContext;
use std::fmt;
use std::str::FromStr;

/// How the task API authenticates its callers (`API_AUTH`; the template's `ApiAuth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// SigV4-signed requests (API Gateway's `AWS_IAM`): service-to-service. The default.
    #[default]
    Iam,
    /// A bearer JWT checked by an HTTP API JWT authorizer (issuer, audience, scopes).
    Jwt,
    /// No authentication: every request is the caller `anonymous`. Only by explicit choice.
    None,
}

impl AuthMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Iam => "IAM",
            Self::Jwt => "JWT",
            Self::None => "None",
        }
    }
}

impl fmt::Display for AuthMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AuthMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "iam" => Ok(Self::Iam),
            "jwt" => Ok(Self::Jwt),
            "none" => Ok(Self::None),
            _ => Err(format!("{s:?} is not an auth mode (IAM, JWT, None)")),
        }
    }
}

/// The caller of one request, as authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// An authenticated principal (or `anonymous` on an API deployed with `None`).
    Caller(Caller),
    /// No credentials, or credentials that did not verify; the reason is logged, never echoed.
    Unauthenticated(String),
}

impl Identity {
    /// The identity of every request to an API without authentication.
    pub fn anonymous() -> Self {
        Self::Caller(Caller::anonymous())
    }
}

/// The identity API Gateway established for a request (`requestContext.authorizer`). A request
/// that reached the function without the authorizer's context (a route left without one by
/// mistake) is unauthenticated: the function checks again what the gateway should have.
pub fn from_api_gateway(mode: AuthMode, ctx: &ApiGatewayV2httpRequestContext) -> Identity {
    let authorizer = ctx.authorizer.as_ref();
    match mode {
        AuthMode::None => Identity::anonymous(),
        AuthMode::Iam => match authorizer
            .and_then(|a| a.iam.as_ref())
            .and_then(|iam| iam.user_arn.as_deref())
        {
            Some(arn) => match Caller::from_iam_arn(arn) {
                Ok(c) => Identity::Caller(c),
                Err(e) => Identity::Unauthenticated(format!("IAM principal: {e}")),
            },
            None => Identity::Unauthenticated("no IAM principal in the request context".into()),
        },
        AuthMode::Jwt => {
            let claims = authorizer.and_then(|a| a.jwt.as_ref()).map(|j| &j.claims);
            // `sub` names the user (or, for a client-credentials token, the client);
            // `client_id` is Cognito's name for the client when `sub` is absent.
            match claims.and_then(|c| c.get("sub").or_else(|| c.get("client_id"))) {
                // A subject of sas's own callers' form (a schedule's) is refused: it would own
                // that schedule's tasks.
                Some(sub) => match Caller::principal(sub.as_str()) {
                    Ok(c) => Identity::Caller(c),
                    Err(e) => Identity::Unauthenticated(format!("JWT subject: {e}")),
                },
                None => Identity::Unauthenticated("no JWT subject in the request context".into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(authorizer: serde_json::Value) -> ApiGatewayV2httpRequestContext {
        serde_json::from_value(serde_json::json!({
            "routeKey": "GET /tasks/{taskId}",
            "accountId": "123456789012",
            "stage": "$default",
            "requestId": "r",
            "apiId": "a",
            "domainName": "a.execute-api.eu-west-1.amazonaws.com",
            "domainPrefix": "a",
            "time": "23/Nov/2026:10:00:00 +0000",
            "timeEpoch": 1,
            "http": {"method": "GET", "path": "/tasks/x", "protocol": "HTTP/1.1", "sourceIp": "1.2.3.4", "userAgent": "t"},
            "authorizer": authorizer,
        }))
        .expect("a request context")
    }

    #[test]
    fn iam_mode_reads_the_principal_arn_and_needs_one() {
        let ctx = context(serde_json::json!({"iam": {
            "accessKey": "ASIA", "accountId": "123456789012", "callerId": "AROA:i-1",
            "userArn": "arn:aws:sts::123456789012:assumed-role/submitter/i-1", "userId": "AROA:i-1"
        }}));
        assert_eq!(
            from_api_gateway(AuthMode::Iam, &ctx),
            Identity::Caller(
                Caller::new("arn:aws:sts::123456789012:assumed-role/submitter").expect("ok")
            )
        );
        // The IAM principal does not count in JWT mode, nor a JWT in IAM mode.
        assert!(matches!(
            from_api_gateway(AuthMode::Jwt, &ctx),
            Identity::Unauthenticated(_)
        ));
        let jwt = context(serde_json::json!({"jwt": {"claims": {"sub": "alice"}, "scopes": null}}));
        assert!(matches!(
            from_api_gateway(AuthMode::Iam, &jwt),
            Identity::Unauthenticated(_)
        ));
        assert_eq!(
            from_api_gateway(AuthMode::Jwt, &jwt),
            Identity::Caller(Caller::new("alice").expect("ok"))
        );
        let client = context(serde_json::json!({"jwt": {"claims": {"client_id": "svc-7"}}}));
        assert_eq!(
            from_api_gateway(AuthMode::Jwt, &client),
            Identity::Caller(Caller::new("svc-7").expect("ok"))
        );
        let none = context(serde_json::Value::Null);
        assert!(matches!(
            from_api_gateway(AuthMode::Iam, &none),
            Identity::Unauthenticated(_)
        ));
        assert_eq!(
            from_api_gateway(AuthMode::None, &none),
            Identity::anonymous()
        );
    }

    /// A schedule's tasks belong to `arn:sas:schedule:<name>`: no token's subject (nor a
    /// client id) may name that caller, whatever the issuer signed.
    #[test]
    fn a_subject_of_a_schedules_form_is_refused() {
        for claims in [
            serde_json::json!({"sub": "arn:sas:schedule:nightly"}),
            serde_json::json!({"client_id": "arn:sas:schedule:nightly"}),
        ] {
            let ctx = context(serde_json::json!({"jwt": {"claims": claims, "scopes": null}}));
            match from_api_gateway(AuthMode::Jwt, &ctx) {
                Identity::Unauthenticated(why) => {
                    assert!(why.contains("reserved"), "{why}")
                }
                other => panic!("a schedule's caller got through: {other:?}"),
            }
        }
    }

    #[test]
    fn modes_parse_case_insensitively() {
        assert_eq!("IAM".parse::<AuthMode>(), Ok(AuthMode::Iam));
        assert_eq!("jwt".parse::<AuthMode>(), Ok(AuthMode::Jwt));
        assert_eq!("None".parse::<AuthMode>(), Ok(AuthMode::None));
        assert!("open".parse::<AuthMode>().is_err());
    }
}
