//! Credentials of HTTP services from Secrets Manager (a secret's string) and SSM Parameter
//! Store (a parameter, read with decryption).

use super::Described;
use crate::domain::workflow::CredentialSource;
use crate::remote::{CredentialError, Credentials, Secret};
use async_trait::async_trait;

/// The [`Credentials`] of a deployment.
#[derive(Debug, Clone)]
pub struct AwsCredentials {
    secrets: aws_sdk_secretsmanager::Client,
    parameters: aws_sdk_ssm::Client,
}

impl AwsCredentials {
    pub fn new(secrets: aws_sdk_secretsmanager::Client, parameters: aws_sdk_ssm::Client) -> Self {
        Self {
            secrets,
            parameters,
        }
    }

    pub fn from_config(config: &aws_config::SdkConfig) -> Self {
        Self::new(
            aws_sdk_secretsmanager::Client::new(config),
            aws_sdk_ssm::Client::new(config),
        )
    }
}

#[async_trait]
impl Credentials for AwsCredentials {
    async fn read(&self, source: &CredentialSource) -> Result<Secret, CredentialError> {
        let fail = |problem: String| CredentialError {
            from: source.clone(),
            problem,
        };
        match source {
            CredentialSource::Secret(id) => {
                let out = self
                    .secrets
                    .get_secret_value()
                    .secret_id(id)
                    .send()
                    .await
                    .described(fail)?;
                if let Some(s) = out.secret_string() {
                    return Ok(Secret::new(s));
                }
                let bytes = out
                    .secret_binary()
                    .ok_or_else(|| fail("the secret has no value".into()))?;
                String::from_utf8(bytes.as_ref().to_vec())
                    .map(Secret::new)
                    .map_err(|_| fail("the secret's binary value is not UTF-8".into()))
            }
            CredentialSource::Parameter(name) => {
                let out = self
                    .parameters
                    .get_parameter()
                    .name(name)
                    .with_decryption(true)
                    .send()
                    .await
                    .described(fail)?;
                out.parameter()
                    .and_then(|p| p.value())
                    .map(Secret::new)
                    .ok_or_else(|| fail("the parameter has no value".into()))
            }
        }
    }
}

/// The Lambda client the agent invokes services with. It makes one attempt per call: the
/// agent's own loop retries, within the step's deadline.
pub fn lambda_client(config: &aws_config::SdkConfig) -> aws_sdk_lambda::Client {
    let conf = aws_sdk_lambda::config::Builder::from(config)
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .build();
    aws_sdk_lambda::Client::from_conf(conf)
}
