"""Local SageMaker: the control plane and S3 (moto, with lmforge's extensions) plus a runtime that
speaks the real ``sagemaker-runtime`` wire protocol and runs each endpoint as an ``lmforge serve``
process. Real boto3 clients and the SageMaker SDK reach it through ``AWS_ENDPOINT_URL*`` alone.
"""
