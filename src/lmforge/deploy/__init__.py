"""Deploying to SageMaker: planning, upload, endpoints."""
