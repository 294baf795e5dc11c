"""The beat schedule: entry name -> task name and interval from Settings. No logic here."""
