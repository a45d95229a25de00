const { greet } = require('./lib/greet');

module.exports = {
  main: async function (event, context) {
    return { message: greet(event.data && event.data.name), function: context['function-name'] };
  },
};
