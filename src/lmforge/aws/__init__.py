"""AWS wire formats lmforge speaks itself (the local SageMaker runtime needs them as a server)."""
