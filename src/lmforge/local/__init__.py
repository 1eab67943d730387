"""Local SageMaker: the control plane, S3 and ECR (moto, with lmforge's extensions, and a real OCI
registry behind ECR) plus a runtime that speaks the real ``sagemaker-runtime`` wire protocol and runs
each endpoint instance as its Model's image (or, in process mode, as an ``lmforge serve`` process).
Real boto3 clients and the SageMaker SDK reach it through ``AWS_ENDPOINT_URL*`` alone.
"""

#: the one account of the local SageMaker (moto's default account)
ACCOUNT_ID = "123456789012"
