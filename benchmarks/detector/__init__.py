"""The ReDet detector against mmrotate's, trained and tested through each project's own tools."""
