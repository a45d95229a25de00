exports.greet = (name) => `Hello, ${name || 'world'}!`;
