"""hpcwatch.analysis"""
