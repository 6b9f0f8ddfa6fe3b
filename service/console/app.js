// Placeholder: the console page script (issue 43); the page author replaces this file.
