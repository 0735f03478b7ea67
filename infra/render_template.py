"""Renders template.yaml into plain CloudFormation JSON with the SAM translator (offline).

The tests create their tables, queues and bus from this output, so the resources they run
against are the ones the template defines. Usage: render_template.py template.yaml out.json
"""

import json
import sys

import boto3

from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator
from samtranslator.yaml_helper import yaml_parse


def main(source: str, target: str) -> None:
    with open(source, encoding="utf-8") as f:
        sam = yaml_parse(f.read())
    # The template names no managed policies, so the translator never needs IAM.
    # Local code paths become placeholder S3 URIs, as `sam package` would make them (cfn-lint
    # does the same before its own transform); the tests never read them.
    for section in (sam.get("Globals", {}).get("Function", {}), *sam["Resources"].values()):
        props = section.get("Properties", section)
        if isinstance(props.get("CodeUri"), str) and not props["CodeUri"].startswith("s3://"):
            props["CodeUri"] = "s3://sas-placeholder/code.zip"
    # Offline: a session with a region and no credentials is all the translator reads.
    session = boto3.session.Session(region_name="us-east-1")
    translator = Translator(managed_policy_map={}, sam_parser=Parser(), boto_session=session)
    cfn = translator.translate(
        sam_template=sam,
        parameter_values={"AWS::AccountId": "123456789012"},
    )
    with open(target, "w", encoding="utf-8") as f:
        json.dump(cfn, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
