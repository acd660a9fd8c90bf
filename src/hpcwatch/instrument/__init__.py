"""hpcwatch.instrument"""
