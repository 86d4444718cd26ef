"""Durable storage I/O (no Ray): storage URLs as tier specs, the job's files there, datasets in a directory or on S3."""
