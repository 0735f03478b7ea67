"""Schemathesis hooks: requests are signed with SigV4 (botocore), as a deployed stack's IAM
authorizer and `sas-local --auth iam` require, over the bytes actually sent.

Schemathesis's own auth step marks a request to sign (`Authorization: SIGN`); the requests auth
below replaces that mark with the signature once the body is final. A request whose
Authorization Schemathesis removed or replaced (its auth checks) goes out as it is, unsigned,
and must be refused with 401.

The access key comes from SAS_CONTRACT_ACCESS_KEY / SAS_CONTRACT_SECRET_KEY (infra/contract/run.sh
writes them into sas-local's users file)."""

import os

import requests
import schemathesis
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


class SigV4(requests.auth.AuthBase):
    """Signs a prepared request for the service execute-api (Host, Content-Type and the body)."""

    def __init__(self, access_key: str, secret_key: str, region: str = "us-east-1"):
        self.credentials = Credentials(access_key, secret_key)
        self.region = region

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        if r.headers.get("Authorization") != MARK:
            return r
        body = r.body or b""
        if isinstance(body, str):
            body = body.encode("utf-8")
        signed = {k: v for k, v in r.headers.items() if k.lower() == "content-type"}
        request = AWSRequest(method=r.method, url=r.url, data=body, headers=signed)
        SigV4Auth(self.credentials, "execute-api", self.region).add_auth(request)
        for name in ("Authorization", "X-Amz-Date"):
            r.headers[name] = request.headers[name]
        return r


MARK = "SIGN"


@schemathesis.auth()
class MarkToSign:
    def get(self, case, context):
        return MARK

    def set(self, case, data, context):
        case.headers = case.headers or {}
        case.headers["Authorization"] = data


AUTH = SigV4(os.environ["SAS_CONTRACT_ACCESS_KEY"], os.environ["SAS_CONTRACT_SECRET_KEY"])


@schemathesis.hook
def before_call(context, case, kwargs):
    kwargs["auth"] = AUTH
