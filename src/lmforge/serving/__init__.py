"""The model server: SageMaker's container contract over the handler layer."""
