"""hpcwatch.security"""
