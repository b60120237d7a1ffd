"""Recall: retrieval, fusion, the gates, confidence and the answer's messages."""
