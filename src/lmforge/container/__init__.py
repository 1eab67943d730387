"""Container images: flavours, rendering from templates, the entrypoint, docker build and push."""
