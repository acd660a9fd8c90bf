"""hpcwatch.sources"""
