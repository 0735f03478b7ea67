//! SigV4 for the operator API: every request signed for `execute-api` with credentials from
//! `aws-config`'s chain (environment, profiles, SSO, container and instance roles), as
//! `awscurl` would, so `sasctl` reaches a deployed stack's IAM-authorized routes directly.

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;

/// Signs requests with one credentials provider, for one region.
#[derive(Debug, Clone)]
pub struct Signer {
    credentials: SharedCredentialsProvider,
    region: String,
    /// The access key id (never the secret) and the provider of the credentials last signed
    /// with, for a `401`'s message.
    last: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

/// Why a request could not be signed.
#[derive(Debug, thiserror::Error)]
#[error("cannot sign the request: {0}")]
pub struct SignError(pub String);

impl Signer {
    pub fn new(credentials: SharedCredentialsProvider, region: impl Into<String>) -> Self {
        Self {
            credentials,
            region: region.into(),
            last: Default::default(),
        }
    }

    /// A signer from the environment's AWS configuration. The region is the configuration's,
    /// else the one in an API Gateway host name (`<id>.execute-api.<region>.amazonaws.com`).
    pub async fn from_environment(endpoint: &url::Url) -> Result<Self, SignError> {
        Self::load(endpoint, None).await
    }

    /// [`Signer::from_environment`], in `region` when the configuration names none.
    pub async fn from_environment_in(endpoint: &url::Url, region: &str) -> Result<Self, SignError> {
        Self::load(endpoint, Some(region)).await
    }

    async fn load(endpoint: &url::Url, fallback: Option<&str>) -> Result<Self, SignError> {
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .load()
            .await;
        let credentials = config.credentials_provider().ok_or_else(|| {
            SignError("no AWS credentials found (environment, profile, SSO)".into())
        })?;
        let region = config
            .region()
            .map(|r| r.to_string())
            .or_else(|| region_of_host(endpoint.host_str().unwrap_or_default()))
            .or_else(|| fallback.map(str::to_owned))
            .ok_or_else(|| SignError("no AWS region (set AWS_REGION)".into()))?;
        Ok(Self::new(credentials, region))
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// What the last request was signed with: the access key id, the credentials' source and
    /// the region (never the secret).
    pub fn describe(&self) -> String {
        let key = self
            .last
            .lock()
            .ok()
            .and_then(|l| l.clone())
            .unwrap_or_else(|| "no credentials yet".into());
        format!(
            "signed (SigV4, execute-api, region {}) with {key}",
            self.region
        )
    }

    /// Signs `request` in place: adds `Authorization`, `X-Amz-Date` and, for temporary
    /// credentials, `X-Amz-Security-Token`, over the method, URL, `Host`, `Content-Type` and
    /// body.
    pub async fn sign(&self, request: &mut reqwest::Request) -> Result<(), SignError> {
        let credentials = self
            .credentials
            .provide_credentials()
            .await
            .map_err(|e| SignError(e.to_string()))?;
        if let Ok(mut last) = self.last.lock() {
            *last = Some(format!(
                "access key {} (from the AWS configuration: environment, profile or SSO)",
                credentials.access_key_id()
            ));
        }
        let identity = credentials.into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("execute-api")
            .time(std::time::SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| SignError(e.to_string()))?
            .into();
        let body = request
            .body()
            .and_then(|b| b.as_bytes())
            .unwrap_or_default()
            .to_vec();
        let headers: Vec<(String, String)> = request
            .headers()
            .iter()
            .filter(|(k, _)| *k == reqwest::header::CONTENT_TYPE)
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let url = request.url().to_string();
        let signable = SignableRequest::new(
            request.method().as_str(),
            &url,
            headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            SignableBody::Bytes(&body),
        )
        .map_err(|e| SignError(e.to_string()))?;
        let (instructions, _) = sign(signable, &params)
            .map_err(|e| SignError(e.to_string()))?
            .into_parts();
        for (name, value) in instructions.headers() {
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| SignError(e.to_string()))?;
            let value = reqwest::header::HeaderValue::from_str(value)
                .map_err(|e| SignError(e.to_string()))?;
            request.headers_mut().insert(name, value);
        }
        Ok(())
    }
}

/// The region of an API Gateway host name, if it is one.
pub fn region_of_host(host: &str) -> Option<String> {
    let mut parts = host.split('.');
    let (_id, service, region) = (parts.next()?, parts.next()?, parts.next()?);
    (service == "execute-api" && !region.is_empty()).then(|| region.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_region_comes_from_an_api_gateway_host() {
        assert_eq!(
            region_of_host("abc123.execute-api.eu-west-1.amazonaws.com").as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(region_of_host("127.0.0.1"), None);
        assert_eq!(region_of_host("api.example.com"), None);
    }
}
