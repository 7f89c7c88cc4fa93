"""A real S3-protocol server on 127.0.0.1 for the tests (moto's server, as DALI's own CI uses; no network).

Started as its own process with authentication on (INITIAL_NO_AUTH_ACTION_COUNT lets the fixture's
first calls create an IAM user and key), so wrong credentials are refused as by a real endpoint.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass
class S3Server:
    endpoint: str
    key: str
    secret: str
    proc: subprocess.Popen

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.key,
                            aws_secret_access_key=self.secret, region_name="us-east-1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start() -> S3Server:
    port = _free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3", "AWS_EC2_METADATA_DISABLED": "true"}
    code = ("from moto.server import ThreadedMotoServer; import time\n"
            f"s = ThreadedMotoServer(ip_address='127.0.0.1', port={port}, verbose=False); s.start()\n"
            "print('up', flush=True)\nwhile True: time.sleep(3600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout.readline().strip() == "up"
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id="bootstrap",
                       aws_secret_access_key="bootstrap", region_name="us-east-1")
    for attempt in range(50):
        try:
            iam.create_user(UserName="fastdata")
            break
        except Exception:  # noqa: BLE001 - the server is still coming up
            time.sleep(0.1)
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="fastdata", PolicyName="all", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="fastdata")["AccessKey"]
    return S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"], proc)
