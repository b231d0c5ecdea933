"""Getting models onto the disk: the Hugging Face cache, resumable downloads, the demo model."""
